// Presentation of answers: the server sends sanitised HTML (`contentHtml`) for
// finished messages; while an answer streams, its text is shown as it grows.
// Code blocks get a copy button and light syntax colouring.

const KEYWORDS = new Set(('as async await break case catch class const continue def del do elif else enum ' +
  'except export extends false finally fn for from func function go if impl import in interface let ' +
  'loop match mod module mut new nil none null package pass pub raise return self static struct super ' +
  'switch this throw trait true try type undefined use var void where while with yield').split(' '));

// Splits code into tokens (strings, comments, numbers, words) and wraps the
// interesting ones; text is escaped by building DOM nodes, never HTML strings.
export function highlight(codeElement) {
  const text = codeElement.textContent;
  const pattern = /(\/\/[^\n]*|#[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`(?:\\.|[^`\\])*`)|(\b\d[\d_.]*\b)|([A-Za-z_][A-Za-z0-9_]*)/g;
  const fragment = document.createDocumentFragment();
  let last = 0;
  for (const match of text.matchAll(pattern)) {
    if (match.index > last) fragment.append(text.slice(last, match.index));
    let kind = null;
    if (match[1]) kind = 'comment';
    else if (match[2]) kind = 'string';
    else if (match[3]) kind = 'number';
    else if (KEYWORDS.has(match[4])) kind = 'keyword';
    if (kind) {
      const span = document.createElement('span');
      span.className = `tok-${kind}`;
      span.textContent = match[0];
      fragment.append(span);
    } else {
      fragment.append(match[0]);
    }
    last = match.index + match[0].length;
  }
  if (last < text.length) fragment.append(text.slice(last));
  codeElement.replaceChildren(fragment);
}

export function decorateCode(container) {
  for (const pre of container.querySelectorAll('pre')) {
    const code = pre.querySelector('code') ?? pre;
    highlight(code);
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'copy';
    button.textContent = 'Copy';
    button.addEventListener('click', async () => {
      await navigator.clipboard?.writeText(code.textContent);
      button.textContent = 'Copied';
      setTimeout(() => { button.textContent = 'Copy'; }, 1500);
    });
    pre.classList.add('has-copy');
    pre.prepend(button);
  }
}

// Streaming text: shown as plain text (no HTML is ever built from it).
export function renderStreaming(element, text) {
  element.classList.add('streaming');
  element.textContent = text;
}

// The server's sanitised HTML of a finished message.
export function renderFinished(element, html, fallbackText) {
  element.classList.remove('streaming');
  if (html) {
    element.innerHTML = html; // produced by the server's Markdown renderer and sanitiser
    decorateCode(element);
  } else {
    element.textContent = fallbackText ?? '';
  }
}
