// The run page of a Duo Workflow session: the live log, the approval box, and
// the run itself. The log follows the workflowEventsUpdated subscription (so
// other tabs see it too) and the checkpoints the service sends this page.
// When the run needs a client (it was just created, or the user answered an
// approval request) this page is that client on the executor socket: the
// monolith answers the service's GitLab API requests with the user's
// permissions, and the page refuses workspace actions, having no checkout.
// A run of the product (its legs run on the server) is only followed: while a
// leg waits or runs, the page fetches itself again and swaps in the run card
// and the Approve / Reject card the server renders.

import { Subscriptions } from './graphql.js';

const data = JSON.parse(document.getElementById('page-data').textContent);
const $ = (id) => document.getElementById(id);

const EVENTS = `subscription($workflowId: AiDuoWorkflowsWorkflowID!) {
  workflowEventsUpdated(workflowId: $workflowId) { checkpoint workflowStatus }
}`;
const STATUSES = ['created', 'running', 'paused', 'finished', 'failed', 'stopped',
  'input_required', 'plan_approval_required', 'tool_call_approval_required'];
const NO_WORKSPACE = 'This client is a web browser: it has no workspace, so file and command tools are not available.';

let status = data.status;
let log = data.log ?? [];
// The executor socket while this page runs the workflow.
let socket = null;
// An approval answer waiting for the previous stream to end.
let queued = null;
// The pending call was answered (until the status moves on).
let answered = false;

function setStatus(next) {
  const name = String(next ?? '').toLowerCase();
  if (!STATUSES.includes(name)) return;
  if (name !== status) answered = false;
  status = name;
  document.body.dataset.status = name;
  const badge = $('status').querySelector('.badge');
  badge.className = `badge status ${name}`;
  badge.dataset.status = name;
  badge.textContent = name.replaceAll('_', ' ');
  if (['finished', 'failed', 'stopped'].includes(name)) $('stop-form')?.remove();
  showApproval();
  describeConnection();
}

// A run left `running` or `paused` without a client can be resumed here.
function showResume() {
  $('resume').hidden = !(data.owner && data.browserClient && !socket && ['running', 'paused'].includes(status));
}

function describeConnection(extra) {
  showResume();
  const line = $('connection');
  if (extra) {
    line.textContent = extra;
    return;
  }
  if (data.productRun) {
    line.textContent = '';
  } else if (!data.browserClient && !['finished', 'failed', 'stopped'].includes(status)) {
    line.textContent = 'This run uses workspace tools (files, commands): it continues in its executor (your IDE or duo-workflow-executor), not in this page.';
  } else if (status === 'tool_call_approval_required' && !answered) line.textContent = 'Waiting for your approval.';
  else if (socket) line.textContent = 'Running in this tab. Closing it stops the run.';
  else line.textContent = '';
}

function toolText(info) {
  if (!info) return '';
  let args = '';
  try {
    args = JSON.stringify(info.args ?? {}, null, 2);
  } catch {
    args = String(info.args);
  }
  return `${info.name}(${args})`;
}

function entryElement(entry) {
  const li = document.createElement('li');
  const type = entry.message_type ?? 'agent';
  li.className = `entry ${type}`;
  if (entry.status) li.dataset.status = entry.status;
  const who = document.createElement('strong');
  who.textContent = {
    user: 'You', agent: 'Duo', tool: 'Tool', request: 'Approval requested', workflow_end: 'End',
  }[type] ?? type;
  const body = document.createElement('div');
  body.className = 'entry-body';
  body.textContent = entry.content ?? '';
  li.append(who, body);
  if (entry.tool_info) {
    const call = document.createElement('pre');
    call.className = 'code tool-call';
    call.textContent = toolText(entry.tool_info);
    li.append(call);
    if (entry.tool_info.tool_response) {
      const result = document.createElement('pre');
      result.className = 'code tool-result';
      result.textContent = entry.tool_info.tool_response;
      li.append(result);
    }
  }
  return li;
}

function renderLog() {
  $('log').replaceChildren(...log.map(entryElement));
  showApproval();
}

function renderPlan(plan) {
  const steps = plan?.steps ?? [];
  $('plan-card').hidden = steps.length === 0;
  $('plan').replaceChildren(...steps.map((step) => {
    const li = document.createElement('li');
    li.textContent = `${step.description} (${step.status ?? 'Not Started'})`;
    return li;
  }));
}

function applyCheckpoint(checkpoint) {
  let value = checkpoint;
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value);
    } catch {
      return;
    }
  }
  const values = value?.channel_values;
  if (!values) return;
  if (Array.isArray(values.ui_chat_log)) {
    log = values.ui_chat_log;
    renderLog();
  }
  if (values.plan) renderPlan(values.plan);
}

// The call waiting for approval: the newest request entry with a tool.
function pendingCall() {
  for (let i = log.length - 1; i >= 0; i--) {
    if (log[i].message_type === 'request') return log[i];
  }
  return null;
}

function showApproval() {
  const box = $('approval');
  const call = status === 'tool_call_approval_required' && data.owner && data.browserClient && !answered ? pendingCall() : null;
  box.hidden = !call;
  if (call) $('pending-call').textContent = call.tool_info ? toolText(call.tool_info) : call.content;
}

function reply(ws, requestID, response) {
  ws.send(JSON.stringify({ actionResponse: { requestID, ...response } }));
}

function onAction(ws, action) {
  if (action.newCheckpoint) {
    applyCheckpoint(action.newCheckpoint.checkpoint);
    setStatus(action.newCheckpoint.status);
    return;
  }
  if (action.runHTTPRequest) {
    reply(ws, action.requestID, { httpResponse: { statusCode: 0, error: 'this client makes no requests outside this instance' } });
    return;
  }
  reply(ws, action.requestID, { plainTextResponse: { response: '', error: NO_WORKSPACE } });
}

function run(start) {
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const ws = new WebSocket(`${scheme}://${location.host}/api/v4/ai/duo_workflows/ws?workflow_id=${data.workflowId}`);
  socket = ws;
  document.body.dataset.running = 'true';
  describeConnection();
  ws.addEventListener('open', () => {
    ws.send(JSON.stringify({
      startRequest: { workflowID: String(data.workflowId), workflowDefinition: data.definition, ...start },
    }));
  });
  ws.addEventListener('message', (event) => {
    try {
      onAction(ws, JSON.parse(event.data));
    } catch (e) {
      describeConnection(`Unreadable message from the server: ${e.message}`);
    }
  });
  ws.addEventListener('close', (event) => {
    socket = null;
    document.body.dataset.running = 'false';
    let why = '';
    if (event.code === 1006) why = 'Could not connect to the run: another session may be running it. Reload to retry.';
    else if (event.code !== 1000 && event.reason) why = `The run ended: ${event.reason}`;
    describeConnection(why);
    if (queued) {
      const next = queued;
      queued = null;
      run(next);
    }
  });
}

function decide(approval) {
  const start = { goal: '', approval };
  answered = true;
  $('approval').hidden = true;
  if (socket) queued = start; // the paused stream is still closing
  else run(start);
}

$('approve').addEventListener('click', () => decide({ approval: {} }));
$('resume').addEventListener('click', () => {
  if (!socket) run({ goal: '' });
});
$('reject').addEventListener('click', () => {
  const message = $('reject-message').value.trim();
  decide({ rejection: message ? { message } : {} });
});
$('stop-form')?.addEventListener('submit', () => {
  // Tell the service first; the form then records the stop.
  if (socket?.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ stopWorkflow: { reason: 'ABORTED' } }));
});

const FOLLOW_INTERVAL_MS = 1500;
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

// Swaps in the server's newest run card and answer card until no leg waits
// or runs any more.
async function followRun() {
  let following = data.following;
  while (following) {
    await sleep(FOLLOW_INTERVAL_MS);
    let doc;
    try {
      const res = await fetch(location.pathname, { credentials: 'same-origin', cache: 'no-store' });
      if (!res.ok) continue;
      doc = new DOMParser().parseFromString(await res.text(), 'text/html');
    } catch {
      continue;
    }
    for (const id of ['run', 'answer-slot', 'summary']) {
      const fresh = doc.getElementById(id);
      const here = $(id);
      if (fresh && here) here.replaceWith(document.importNode(fresh, true));
    }
    try {
      const next = JSON.parse(doc.getElementById('page-data').textContent);
      setStatus(next.status);
      following = next.following;
    } catch {
      // A page without its data block: try again.
    }
  }
  document.body.dataset.following = 'false';
}

async function start() {
  document.body.dataset.status = status;
  renderLog();
  renderPlan(data.plan);
  describeConnection();
  const live = new Subscriptions();
  live.subscribe(EVENTS, { workflowId: data.workflowGid }, (payload) => {
    const event = payload?.workflowEventsUpdated;
    if (!event) return;
    if (event.checkpoint) applyCheckpoint(event.checkpoint);
    setStatus(event.workflowStatus);
  });
  await live.whenReady();
  document.body.dataset.live = 'true';
  // A new run starts as soon as its owner opens it (right after the form).
  if (status === 'created' && data.owner && data.browserClient) run({ goal: data.goal });
  if (data.productRun) {
    document.body.dataset.following = String(Boolean(data.following));
    followRun();
  }
}

start();
