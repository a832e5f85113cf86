// The snapshot viewer's page: a dropped (or chosen) file goes to the worker, which makes
// lab-03 view's page of it in WebAssembly; the page is shown in the frame and can be
// saved. The frame's element carries the page's state for the book's browser test.

const drop = document.getElementById('viewer-drop');
const input = document.getElementById('viewer-file');
const status = document.getElementById('viewer-status');
const frame = document.getElementById('viewer-frame');
const save = document.getElementById('viewer-save');

let worker = null;
let next = 0;
let pending = null;
let made = null; // { name, html }

function say(text, error) {
  status.textContent = text;
  status.className = error ? 'calc-error' : '';
  drop.dataset.state = error ? 'error' : pending ? 'busy' : made ? 'shown' : 'ready';
  if (error) drop.dataset.error = text;
  else delete drop.dataset.error;
}

function startWorker() {
  worker = new Worker(new URL('worker.js', import.meta.url), { type: 'module' });
  worker.onmessage = (event) => {
    const m = event.data;
    if (m.loadError) {
      say(m.loadError, true);
      return;
    }
    if (m.loaded || !pending || m.id !== pending.id) return;
    const name = pending.name;
    pending = null;
    drop.dataset.done = String(m.id);
    if (m.error) {
      say(m.error, true);
      return;
    }
    made = { name, html: m.page };
    frame.removeAttribute('src');
    frame.srcdoc = m.page;
    save.disabled = false;
    say(`${name}: read in ${Math.round(m.ms)} ms.`, false);
  };
  worker.onerror = (e) => {
    e.preventDefault();
    pending = null;
    say(`the viewer stopped: ${e.message || 'its worker failed'} (a file this large is read by lab-03 view on the command line)`, true);
    worker.terminate();
    startWorker();
  };
}

async function open(file) {
  if (!file) return;
  if (pending) {
    worker.terminate();
    startWorker();
  }
  const id = ++next;
  pending = { id, name: file.name };
  say(`reading ${file.name}…`, false);
  let bytes;
  try {
    bytes = await file.arrayBuffer();
  } catch (e) {
    pending = null;
    drop.dataset.done = String(id);
    say(`${file.name} could not be read: ${e}`, true);
    return;
  }
  if (!pending || pending.id !== id) return;
  worker.postMessage({ id, bytes, name: file.name }, [bytes]);
}

drop.addEventListener('dragover', (e) => {
  e.preventDefault();
  drop.classList.add('over');
});
drop.addEventListener('dragleave', () => drop.classList.remove('over'));
drop.addEventListener('drop', (e) => {
  e.preventDefault();
  drop.classList.remove('over');
  open(e.dataTransfer.files[0]);
});
input.addEventListener('change', () => open(input.files[0]));
save.addEventListener('click', () => {
  if (!made) return;
  const a = document.createElement('a');
  a.href = URL.createObjectURL(new Blob([made.html], { type: 'text/html' }));
  a.download = made.name.replace(/\.[^.]*$/, '') + '.html';
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
});

startWorker();
say('', false);
