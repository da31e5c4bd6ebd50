// The GraphQL explorer: a query and its variables run against /api/graphql
// with the page's session (graphql.js sends the CSRF token, as for chat), the
// answer pretty-printed, the last queries kept in this browser, and the schema
// read by introspection: the list of types first, one type's fields when it
// is opened.

import { postGraphql } from './graphql.js';

const data = JSON.parse(document.getElementById('page-data').textContent);
const $ = (id) => document.getElementById(id);
const queryBox = $('query');
const variablesBox = $('variables');
const variablesError = $('variables-error');
const result = $('result');
const resultStatus = $('result-status');

const HISTORY_KEY = `duo.graphql-explorer.history.${data.username}`;
const HISTORY_SIZE = 20;
const INDENT = '  ';

const TYPE_REF = 'kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } }';
const TYPES = 'query explorerTypes { __schema { queryType { name } mutationType { name } subscriptionType { name } types { name kind description } } }';
const TYPE = `query explorerType($name: String!) {
  __type(name: $name) {
    name kind description
    fields(includeDeprecated: true) { name description isDeprecated deprecationReason args { name description defaultValue type { ${TYPE_REF} } } type { ${TYPE_REF} } }
    inputFields { name description defaultValue type { ${TYPE_REF} } }
    enumValues(includeDeprecated: true) { name description isDeprecated }
    interfaces { name }
    possibleTypes { name }
  }
}`;

// ---- editing ----------------------------------------------------------------

// Tab indents (Shift+Tab outdents) the current or selected lines; Escape
// then Tab leaves the editor, so the keyboard is never trapped.
let released = false;

function indent(box, outdent) {
  const { value, selectionStart, selectionEnd } = box;
  const lineStart = value.lastIndexOf('\n', selectionStart - 1) + 1;
  if (!outdent && selectionStart === selectionEnd) {
    box.setRangeText(INDENT, selectionStart, selectionEnd, 'end');
    return;
  }
  const block = value.slice(lineStart, selectionEnd);
  const lines = block.split('\n');
  const changed = lines.map((line) => {
    if (!outdent) return INDENT + line;
    return line.startsWith(INDENT) ? line.slice(INDENT.length) : line.replace(/^ /, '');
  }).join('\n');
  box.setRangeText(changed, lineStart, selectionEnd, 'select');
}

for (const box of [queryBox, variablesBox]) {
  box.addEventListener('focus', () => { released = false; });
  box.addEventListener('keydown', (event) => {
    if (event.key === 'Escape') {
      released = true;
      return;
    }
    if (event.key === 'Tab' && !released && !event.ctrlKey && !event.altKey && !event.metaKey) {
      event.preventDefault();
      indent(box, event.shiftKey);
    }
    if (event.key !== 'Tab') released = false;
  });
}

document.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    run();
  }
});

// ---- running ----------------------------------------------------------------

// The variables as an object, or an error message for the user.
function parseVariables(text) {
  if (!text.trim()) return { variables: {} };
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { error: `The variables are not valid JSON: ${e.message}` };
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return { error: 'The variables must be a JSON object, such as {"id": "gid://gitlab/Issue/1"}.' };
  }
  return { variables: value };
}

// With several named operations in the document, the one the cursor is in.
function operationAtCursor(text, cursor) {
  const heads = [...text.matchAll(/^\s*(?:query|mutation|subscription)\s+([_A-Za-z][_0-9A-Za-z]*)/gm)];
  if (heads.length < 2) return undefined;
  const before = heads.filter((h) => h.index <= cursor);
  return (before[before.length - 1] ?? heads[0])[1];
}

let running = false;

async function run() {
  if (running) return;
  const query = queryBox.value;
  const parsed = parseVariables(variablesBox.value);
  variablesError.hidden = !parsed.error;
  variablesError.textContent = parsed.error ?? '';
  if (parsed.error) {
    variablesBox.setAttribute('aria-invalid', 'true');
    return;
  }
  variablesBox.removeAttribute('aria-invalid');
  const request = { query, variables: parsed.variables };
  const operationName = operationAtCursor(query, queryBox.selectionStart);
  if (operationName) request.operationName = operationName;
  running = true;
  $('run').disabled = true;
  resultStatus.textContent = 'Running…';
  const started = performance.now();
  try {
    const { response, body } = await postGraphql(request);
    const ms = Math.round(performance.now() - started);
    const failed = !response.ok || body.errors?.length;
    resultStatus.textContent = `HTTP ${response.status} · ${ms} ms${failed ? ' · with errors' : ''}`;
    result.classList.toggle('failed', Boolean(failed));
    result.textContent = JSON.stringify(body, null, 2);
    remember(query, variablesBox.value);
  } catch (e) {
    resultStatus.textContent = 'The request failed';
    result.classList.add('failed');
    result.textContent = e.message;
  } finally {
    running = false;
    $('run').disabled = false;
    result.dataset.done = String(Date.now());
  }
}

$('run').addEventListener('click', run);

// ---- history ----------------------------------------------------------------

function loadHistory() {
  try {
    const list = JSON.parse(localStorage.getItem(HISTORY_KEY) ?? '[]');
    return Array.isArray(list) ? list.filter((h) => typeof h?.query === 'string') : [];
  } catch {
    return [];
  }
}

function remember(query, variables) {
  const kept = loadHistory().filter((h) => h.query !== query || h.variables !== variables);
  kept.unshift({ query, variables, at: new Date().toISOString() });
  try {
    localStorage.setItem(HISTORY_KEY, JSON.stringify(kept.slice(0, HISTORY_SIZE)));
  } catch {
    // Storage full or off: the history is a convenience only.
  }
  drawHistory();
}

function drawHistory() {
  const list = $('history');
  list.replaceChildren();
  const entries = loadHistory();
  if (entries.length === 0) {
    const empty = document.createElement('li');
    empty.className = 'muted';
    empty.textContent = 'Queries you run are kept here, in this browser.';
    list.append(empty);
    return;
  }
  for (const entry of entries) {
    const item = document.createElement('li');
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'link';
    const firstLine = entry.query.trim().split('\n')[0] || '(empty)';
    button.textContent = firstLine.length > 80 ? `${firstLine.slice(0, 79)}…` : firstLine;
    button.title = entry.query;
    button.addEventListener('click', () => {
      queryBox.value = entry.query;
      variablesBox.value = entry.variables ?? '';
      queryBox.focus();
    });
    const when = document.createElement('span');
    when.className = 'muted';
    when.textContent = ` ${new Date(entry.at).toLocaleString()}`;
    item.append(button, when);
    list.append(item);
  }
}

// ---- the schema ---------------------------------------------------------------

let types = [];
// The root types' names: query, mutation, subscription (listed first, so).
let roots = new Set();

function rootRank(name) {
  const rank = [...roots].indexOf(name);
  return rank === -1 ? roots.size : rank;
}

function typeLink(name) {
  const button = document.createElement('button');
  button.type = 'button';
  button.className = 'link type-link';
  button.textContent = name;
  button.addEventListener('click', () => openType(name));
  return button;
}

// `[Type!]!` with the named type clickable.
function typeRef(ref) {
  const span = document.createElement('span');
  span.className = 'type-ref';
  if (!ref) return span;
  if (ref.kind === 'NON_NULL') {
    span.append(typeRef(ref.ofType), '!');
  } else if (ref.kind === 'LIST') {
    span.append('[', typeRef(ref.ofType), ']');
  } else {
    span.append(typeLink(ref.name));
  }
  return span;
}

function description(text) {
  const p = document.createElement('p');
  p.className = 'muted';
  p.textContent = text;
  return p;
}

function drawTypes() {
  const filter = $('type-filter').value.trim().toLowerCase();
  const list = $('types');
  list.replaceChildren();
  const shown = types
    .filter((t) => !t.name.startsWith('__'))
    .filter((t) => !filter || t.name.toLowerCase().includes(filter))
    .sort((a, b) => rootRank(a.name) - rootRank(b.name) || a.name.localeCompare(b.name));
  for (const type of shown) {
    const item = document.createElement('li');
    item.dataset.type = type.name;
    item.append(typeLink(type.name), ' ');
    const kind = document.createElement('span');
    kind.className = 'badge';
    kind.textContent = roots.has(type.name) ? 'root' : type.kind.toLowerCase().replace('_', ' ');
    item.append(kind);
    list.append(item);
  }
}

function fieldItem(field) {
  const item = document.createElement('li');
  item.className = 'field';
  item.dataset.field = field.name;
  const head = document.createElement('code');
  head.append(field.name);
  if (field.args?.length) {
    head.append('(');
    field.args.forEach((arg, i) => {
      if (i) head.append(', ');
      head.append(`${arg.name}: `, typeRef(arg.type));
      if (arg.defaultValue != null) head.append(` = ${arg.defaultValue}`);
    });
    head.append(')');
  }
  if (field.type) head.append(': ', typeRef(field.type));
  item.append(head);
  if (field.isDeprecated) {
    const badge = document.createElement('span');
    badge.className = 'badge';
    badge.textContent = 'deprecated';
    badge.title = field.deprecationReason ?? '';
    item.append(' ', badge);
  }
  if (field.description) item.append(description(field.description));
  const described = (field.args ?? []).filter((a) => a.description);
  if (described.length) {
    const args = document.createElement('ul');
    args.className = 'args';
    for (const arg of described) {
      const li = document.createElement('li');
      const name = document.createElement('code');
      name.textContent = arg.name;
      li.append(name, `: ${arg.description}`);
      args.append(li);
    }
    item.append(args);
  }
  return item;
}

function section(title, items) {
  const box = document.createElement('section');
  const heading = document.createElement('h4');
  heading.textContent = title;
  const list = document.createElement('ul');
  list.className = 'fields';
  list.append(...items);
  box.append(heading, list);
  return box;
}

async function openType(name) {
  const detail = $('type-detail');
  detail.hidden = false;
  detail.replaceChildren(description(`Loading ${name}…`));
  const { response, body } = await postGraphql({ query: TYPE, variables: { name } });
  const type = body.data?.__type;
  detail.replaceChildren();
  if (!response.ok || !type) {
    detail.append(description(`Could not read ${name}: ${body.errors?.[0]?.message ?? body.message ?? `HTTP ${response.status}`}`));
    return;
  }
  detail.dataset.type = type.name;
  const heading = document.createElement('h3');
  heading.append(type.name, ' ');
  const kind = document.createElement('span');
  kind.className = 'badge';
  kind.textContent = type.kind.toLowerCase().replace('_', ' ');
  heading.append(kind);
  detail.append(heading);
  if (type.description) detail.append(description(type.description));
  if (type.interfaces?.length) {
    const p = document.createElement('p');
    p.append('Implements ');
    type.interfaces.forEach((t, i) => p.append(i ? ', ' : '', typeLink(t.name)));
    detail.append(p);
  }
  if (type.fields?.length) detail.append(section('Fields', type.fields.map(fieldItem)));
  if (type.inputFields?.length) detail.append(section('Input fields', type.inputFields.map(fieldItem)));
  if (type.enumValues?.length) detail.append(section('Values', type.enumValues.map(fieldItem)));
  if (type.possibleTypes?.length) {
    detail.append(section('Possible types', type.possibleTypes.map((t) => {
      const li = document.createElement('li');
      li.append(typeLink(t.name));
      return li;
    })));
  }
  for (const item of $('types').children) {
    item.classList.toggle('selected', item.dataset.type === type.name);
  }
}

async function loadSchema() {
  const status = $('schema-status');
  try {
    const { response, body } = await postGraphql({ query: TYPES, variables: {} });
    const schema = body.data?.__schema;
    if (!response.ok || !schema) {
      throw new Error(body.errors?.[0]?.message ?? body.message ?? `HTTP ${response.status}`);
    }
    types = schema.types;
    roots = new Set([schema.queryType, schema.mutationType, schema.subscriptionType]
      .filter(Boolean).map((t) => t.name));
    status.hidden = true;
    drawTypes();
  } catch (e) {
    status.textContent = `The schema could not be read: ${e.message}`;
  }
}

$('type-filter').addEventListener('input', drawTypes);

drawHistory();
loadSchema();
queryBox.focus();
