// GraphQL over HTTP (with the session's CSRF token, as GitLab's frontend sends
// it) and over a graphql-transport-ws socket for subscriptions. The socket
// reconnects on its own (the server closes with 1012 when it restarts) and
// resubscribes everything that was open.

const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content ?? '';

// One POST to /api/graphql as the signed-in user; the HTTP status and the
// parsed body (`{}` when it is not JSON), errors included.
export async function postGraphql(request) {
  const response = await fetch('/api/graphql', {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrf() },
    body: JSON.stringify(request),
  });
  const body = await response.json().catch(() => ({}));
  return { response, body };
}

export async function gql(query, variables = {}) {
  const { response, body } = await postGraphql({ query, variables });
  if (!response.ok) {
    throw new Error(body.message || body.errors?.[0]?.message || `HTTP ${response.status}`);
  }
  if (body.errors?.length) {
    const error = new Error(body.errors[0].message);
    error.code = body.errors[0].extensions?.code;
    throw error;
  }
  return body.data;
}

export class Subscriptions {
  constructor() {
    this.active = new Map(); // id -> { query, variables, onData }
    this.nextId = 1;
    this.ready = false;
    this.waiting = [];
    this.connect();
  }

  connect() {
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    this.socket = new WebSocket(`${scheme}://${location.host}/api/graphql`, 'graphql-transport-ws');
    this.socket.addEventListener('open', () => {
      this.socket.send(JSON.stringify({ type: 'connection_init', payload: {} }));
    });
    this.socket.addEventListener('message', (event) => this.receive(JSON.parse(event.data)));
    this.socket.addEventListener('close', () => {
      this.ready = false;
      // Reconnect (another replica answers after a restart) and resubscribe.
      setTimeout(() => this.connect(), 500);
    });
  }

  receive(message) {
    switch (message.type) {
      case 'connection_ack':
        this.ready = true;
        for (const [id, sub] of this.active) this.send(id, sub);
        for (const resolve of this.waiting.splice(0)) resolve();
        break;
      case 'ping':
        this.socket.send(JSON.stringify({ type: 'pong' }));
        break;
      case 'next': {
        const sub = this.active.get(message.id);
        if (sub) sub.onData(message.payload.data, message.payload.errors);
        break;
      }
      case 'error': {
        const sub = this.active.get(message.id);
        if (sub?.onError) sub.onError(message.payload);
        break;
      }
      default:
        break;
    }
  }

  send(id, sub) {
    this.socket.send(JSON.stringify({
      id, type: 'subscribe', payload: { query: sub.query, variables: sub.variables },
    }));
  }

  // Resolves once the socket is connected and acknowledged.
  whenReady() {
    return this.ready ? Promise.resolve() : new Promise((resolve) => this.waiting.push(resolve));
  }

  subscribe(query, variables, onData, onError) {
    const id = String(this.nextId++);
    const sub = { query, variables, onData, onError };
    this.active.set(id, sub);
    if (this.ready) this.send(id, sub);
    return () => {
      this.active.delete(id);
      if (this.ready) this.socket.send(JSON.stringify({ id, type: 'complete' }));
    };
  }
}
