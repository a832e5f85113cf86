// The calculator's worker: loads the dry run (WebAssembly) and answers each request,
// so that a long run never freezes the page (the page can stop it by ending the worker).
import init, { answer } from './pkg/labs_calculator.js';

const ready = init();

self.onmessage = async (event) => {
  try {
    await ready;
  } catch (e) {
    self.postMessage({ id: event.data.id, error: `the calculator could not load its WebAssembly: ${e}` });
    return;
  }
  const started = performance.now();
  let reply;
  try {
    reply = JSON.parse(answer(JSON.stringify(event.data.request)));
  } catch (e) {
    reply = { error: `the dry run failed: ${e}` };
  }
  reply.id = event.data.id;
  reply.ms = performance.now() - started;
  self.postMessage(reply);
};
ready.then(
  () => self.postMessage({ loaded: true }),
  (e) => self.postMessage({ loadError: `the calculator could not load its WebAssembly: ${e}` }),
);
