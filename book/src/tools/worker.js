// The worker of the book's tool pages: loads the labs' code compiled to WebAssembly
// (book/browser) and runs each request off the page's thread, so that a long run never
// freezes the page (the page can stop it by ending the worker).
//   { id, request }      -> the calculator's answer (lab-10's dry run)
//   { id, bytes, name }  -> the snapshot viewer's page (lab-03 view's)
import init, { answer, view_page } from './pkg/labs_browser.js';

const ready = init();

self.onmessage = async (event) => {
  const m = event.data;
  try {
    await ready;
  } catch (e) {
    self.postMessage({ id: m.id, error: `the page could not load its WebAssembly: ${e}` });
    return;
  }
  const started = performance.now();
  let reply;
  try {
    const json = m.bytes !== undefined ? view_page(new Uint8Array(m.bytes), m.name) : answer(JSON.stringify(m.request));
    reply = JSON.parse(json);
  } catch (e) {
    reply = { error: `failed: ${e}` };
  }
  reply.id = m.id;
  reply.ms = performance.now() - started;
  self.postMessage(reply);
};
ready.then(
  () => self.postMessage({ loaded: true }),
  (e) => self.postMessage({ loadError: `the page could not load its WebAssembly: ${e}` }),
);
