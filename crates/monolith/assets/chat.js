// The chat page: threads, messages, asking, streaming answers, slash commands,
// feedback. Everything goes through the public GraphQL API and subscription.

import { gql, Subscriptions } from './graphql.js';
import { renderFinished, renderStreaming } from './markdown.js';

const data = JSON.parse(document.getElementById('page-data').textContent);
const $ = (id) => document.getElementById(id);
const list = $('messages');
const question = $('question');
const menu = $('slash-menu');
const stopButton = $('stop');

const MESSAGE_FIELDS = 'id requestId content contentHtml errors errorCode role timestamp chunkId threadId type extras { sources hasFeedback }';
const THREADS = `query { aiConversationThreads { nodes { id title lastUpdatedAt conversationType } } }`;
const MESSAGES = `query($threadId: AiConversationThreadID!) { aiMessages(threadId: $threadId) { nodes { ${MESSAGE_FIELDS} } } }`;
const ASK = `mutation($content: String!, $resourceId: AiModelID, $additionalContext: [AiAdditionalContextInput!], $clientSubscriptionId: String, $threadId: AiConversationThreadID, $conversationType: AiConversationsThreadsConversationType) {
  aiAction(input: { chat: { content: $content, resourceId: $resourceId, additionalContext: $additionalContext }, clientSubscriptionId: $clientSubscriptionId, threadId: $threadId, conversationType: $conversationType }) { requestId threadId errors }
}`;
const LIVE = `subscription($userId: UserID!, $clientSubscriptionId: String) {
  aiCompletionResponse(userId: $userId, aiAction: CHAT, clientSubscriptionId: $clientSubscriptionId) { ${MESSAGE_FIELDS} }
}`;
const FEEDBACK = `mutation($messageId: ID!, $helpful: Boolean!, $reason: String) {
  aiChatFeedback(input: { messageId: $messageId, helpful: $helpful, reason: $reason }) { errors }
}`;

const tabId = `tab-${crypto.randomUUID()}`;
let thread = data.thread ?? null;
let resource = data.resource ?? null;
// A file, directory or repository attached by the repository browser.
let additionalContext = data.additionalContext ?? null;
// Answers being streamed to this tab: requestId -> { text, chunks, stopped }.
const streaming = new Map();
// Requests whose final answer arrived (a late chunk from the other
// subscription must not reopen them).
const finished = new Set();

function errorLine(message) {
  const code = message.errorCode;
  const p = document.createElement('p');
  p.className = 'error';
  const text = (message.errors?.[0] ?? '').replace(/\s*Error code: \[[A-Z]\d+\]\([^)]*\)\s*$/, '');
  p.append(text || 'The answer failed.');
  if (code) {
    p.append(' ');
    const link = document.createElement('a');
    link.href = `/help/error-codes#${code.toLowerCase()}`;
    link.textContent = `Error code ${code}`;
    link.title = 'What this error means and what to do';
    p.append(link);
  }
  return p;
}

function feedbackButtons(message) {
  const box = document.createElement('div');
  box.className = 'feedback';
  if (message.extras?.hasFeedback) {
    box.textContent = 'Thanks for your feedback.';
    return box;
  }
  for (const [helpful, label] of [[true, 'Helpful'], [false, 'Not helpful']]) {
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'small';
    button.textContent = label;
    button.setAttribute('aria-label', label);
    button.addEventListener('click', async () => {
      const reason = helpful ? null : (prompt('What was wrong with this answer? (optional)') ?? '');
      try {
        await gql(FEEDBACK, { messageId: message.id, helpful, reason });
        box.textContent = 'Thanks for your feedback.';
      } catch (e) {
        box.textContent = `Feedback not sent: ${e.message}`;
      }
    });
    box.append(button);
  }
  return box;
}

function messageElement(message) {
  const key = `${message.requestId}:${message.role}`;
  let item = list.querySelector(`[data-key="${CSS.escape(key)}"]`);
  if (!item) {
    item = document.createElement('li');
    item.className = `message ${message.role.toLowerCase()}`;
    item.dataset.key = key;
    const body = document.createElement('div');
    body.className = 'body prose';
    item.append(body);
    list.append(item);
  }
  return item;
}

// A tool the answer is using now (a TOOL message): a status line above the
// answer, gone when the answer is final.
function showTool(message) {
  if (finished.has(message.requestId)) return;
  const item = messageElement({ requestId: message.requestId, role: 'ASSISTANT' });
  let status = item.querySelector('.tool-status');
  if (!status) {
    status = document.createElement('p');
    status.className = 'tool-status';
    status.setAttribute('role', 'status');
    item.prepend(status);
  }
  status.textContent = message.content ?? '';
  stopButton.hidden = false;
}

function showMessage(message) {
  const item = messageElement(message);
  const body = item.querySelector('.body');
  item.querySelector('.tool-status')?.remove();
  item.querySelector('.error')?.remove();
  item.querySelector('.feedback')?.remove();
  if (message.role === 'USER') {
    body.textContent = message.content;
  } else if (message.errors?.length) {
    body.replaceChildren();
    item.append(errorLine(message));
  } else {
    renderFinished(body, message.contentHtml, message.content);
    if (message.id) item.append(feedbackButtons(message));
  }
  item.scrollIntoView({ block: 'end' });
}

function showChunk(message) {
  if (finished.has(message.requestId)) return;
  const state = streaming.get(message.requestId) ?? { text: '', chunks: new Map(), stopped: false };
  streaming.set(message.requestId, state);
  if (state.stopped) return;
  // Chunks are numbered from 1; put them in order whatever order they arrive in.
  state.chunks.set(message.chunkId, message.content ?? '');
  let text = '';
  for (let i = 1; state.chunks.has(i); i++) text += state.chunks.get(i);
  state.text = text;
  const item = messageElement({ requestId: message.requestId, role: 'ASSISTANT' });
  renderStreaming(item.querySelector('.body'), text);
  stopButton.hidden = false;
}

function onLive(payload) {
  const message = payload?.aiCompletionResponse;
  if (!message) return;
  if (message.threadId && thread && message.threadId !== thread) return;
  if (message.type === 'TOOL') {
    showTool(message);
    return;
  }
  if (message.chunkId) {
    showChunk(message);
    return;
  }
  const state = streaming.get(message.requestId);
  if (message.role === 'ASSISTANT') finished.add(message.requestId);
  if (state?.stopped && message.role === 'ASSISTANT') return;
  if (message.role === 'ASSISTANT') streaming.delete(message.requestId);
  if (streaming.size === 0) stopButton.hidden = true;
  showMessage(message);
  if (message.role === 'ASSISTANT') loadThreads();
}

async function loadThreads() {
  const result = await gql(THREADS);
  const ul = $('thread-list');
  ul.replaceChildren();
  for (const t of result.aiConversationThreads.nodes) {
    const li = document.createElement('li');
    const a = document.createElement('a');
    a.href = `/-/chat?thread=${encodeURIComponent(t.id)}`;
    a.textContent = t.title || 'New conversation';
    if (t.id === thread) a.setAttribute('aria-current', 'page');
    a.addEventListener('click', (event) => {
      event.preventDefault();
      openThread(t.id);
    });
    li.append(a);
    ul.append(li);
  }
}

async function openThread(id) {
  thread = id;
  history.replaceState(null, '', id ? `/-/chat?thread=${encodeURIComponent(id)}` : '/-/chat');
  list.replaceChildren();
  if (id) {
    const result = await gql(MESSAGES, { threadId: id });
    for (const message of result.aiMessages.nodes) showMessage(message);
  }
  loadThreads();
}

function showAttached() {
  const box = $('attached');
  if (!resource) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  box.replaceChildren();
  const title = additionalContext ? data.contextTitle : (data.resourceTitle || resource);
  box.append(`Asking about: ${title} `);
  const remove = document.createElement('button');
  remove.type = 'button';
  remove.className = 'link';
  remove.textContent = 'Remove';
  remove.addEventListener('click', () => {
    resource = null;
    additionalContext = null;
    showAttached();
  });
  box.append(remove);
}

async function ask(content) {
  const variables = { content, clientSubscriptionId: tabId };
  if (resource) variables.resourceId = resource;
  else variables.resourceId = data.userGid;
  if (additionalContext) variables.additionalContext = additionalContext;
  if (thread) variables.threadId = thread;
  else variables.conversationType = 'DUO_CHAT';
  const result = await gql(ASK, variables);
  const payload = result.aiAction;
  if (payload.errors?.length) throw new Error(payload.errors[0]);
  const command = content.trim().split(/\s/)[0];
  if (payload.threadId && payload.threadId !== thread) {
    // /new and /clear answer with another thread; a first question creates one.
    thread = payload.threadId;
    history.replaceState(null, '', `/-/chat?thread=${encodeURIComponent(thread)}`);
    if (command === '/new' || command === '/clear') list.replaceChildren();
  }
  if (command !== '/new' && command !== '/clear' && command !== '/reset') {
    showMessage({ requestId: payload.requestId, role: 'USER', content });
    // The answer may have started streaming, or even finished, before this
    // response arrived (the worker can be faster than the way back): keep
    // what it already shows instead of starting over.
    if (!streaming.has(payload.requestId) && !finished.has(payload.requestId)) {
      streaming.set(payload.requestId, { text: '', chunks: new Map(), stopped: false });
      const item = messageElement({ requestId: payload.requestId, role: 'ASSISTANT' });
      renderStreaming(item.querySelector('.body'), '…');
      stopButton.hidden = false;
    }
  }
  loadThreads();
}

// ---- the question box and the slash-command menu ---------------------------

let menuIndex = 0;

function menuMatches() {
  const text = question.value;
  if (!text.startsWith('/') || /\s/.test(text)) return [];
  return data.commands.filter((c) => c.command.startsWith(text));
}

function drawMenu() {
  const matches = menuMatches();
  if (matches.length === 0) {
    menu.hidden = true;
    return;
  }
  menuIndex = Math.min(menuIndex, matches.length - 1);
  menu.replaceChildren();
  matches.forEach((c, i) => {
    const option = document.createElement('div');
    option.className = 'option';
    option.setAttribute('role', 'option');
    option.setAttribute('aria-selected', String(i === menuIndex));
    const name = document.createElement('strong');
    name.textContent = c.command;
    option.append(name, ` ${c.description}`);
    option.addEventListener('mousedown', (event) => {
      event.preventDefault();
      complete(c.command);
    });
    menu.append(option);
  });
  menu.hidden = false;
}

function complete(command) {
  question.value = `${command} `;
  menu.hidden = true;
  question.focus();
}

question.addEventListener('input', () => {
  menuIndex = 0;
  drawMenu();
});

question.addEventListener('keydown', (event) => {
  const matches = menu.hidden ? [] : menuMatches();
  if (matches.length) {
    if (event.key === 'ArrowDown' || event.key === 'ArrowUp') {
      event.preventDefault();
      menuIndex = (menuIndex + (event.key === 'ArrowDown' ? 1 : matches.length - 1)) % matches.length;
      drawMenu();
      return;
    }
    if (event.key === 'Tab' || (event.key === 'Enter' && question.value !== matches[menuIndex].command)) {
      event.preventDefault();
      complete(matches[menuIndex].command);
      return;
    }
    if (event.key === 'Escape') {
      menu.hidden = true;
      return;
    }
  }
  if (event.key === 'Enter' && !event.shiftKey) {
    event.preventDefault();
    $('ask').requestSubmit();
  }
});

// Asks; a refused question shows as a line in the conversation.
async function askShowingErrors(content) {
  try {
    await ask(content);
  } catch (e) {
    const item = document.createElement('li');
    item.className = 'message system';
    item.append(errorLine({ errors: [e.message] }));
    list.append(item);
  }
}

$('ask').addEventListener('submit', async (event) => {
  event.preventDefault();
  const content = question.value.trim();
  if (!content) return;
  question.value = '';
  menu.hidden = true;
  await askShowingErrors(content);
});

stopButton.addEventListener('click', () => {
  for (const [requestId, state] of streaming) {
    state.stopped = true;
    const item = messageElement({ requestId, role: 'ASSISTANT' });
    item.querySelector('.body').textContent = `${state.text}\n\n(stopped)`;
  }
  stopButton.hidden = true;
});

$('new-chat').addEventListener('click', () => openThread(null));

// ---- start ------------------------------------------------------------------

async function start() {
  const me = await gql('query { currentUser { duoChatAvailable } }');
  // The server says why (from the policy); the API alone only says whether.
  const unavailable = data.unavailable
    || (!me.currentUser?.duoChatAvailable && 'Duo Chat is not available to you: you need a GitLab Duo seat. Ask an administrator to assign you one.');
  if (unavailable) {
    const notice = $('availability');
    notice.hidden = false;
    notice.textContent = unavailable;
    question.disabled = true;
    $('send').disabled = true;
  }
  showAttached();
  const live = new Subscriptions();
  live.subscribe(LIVE, { userId: data.userGid }, onLive);
  live.subscribe(LIVE, { userId: data.userGid, clientSubscriptionId: tabId }, onLive);
  await live.whenReady();
  document.body.dataset.live = 'true';
  await openThread(thread);
  // A predefined question from an item page ("Explain this job failure"):
  // sent once when the page was opened from this site, else only filled in.
  if (data.prompt && resource && !unavailable) {
    if (data.sendPrompt) {
      await askShowingErrors(data.prompt);
    } else {
      question.value = data.prompt;
    }
  }
  question.focus();
}

start();
