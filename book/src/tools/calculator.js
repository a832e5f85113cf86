// The calculator's page: the form becomes lab-10's flags, a worker runs the dry run
// (WebAssembly, see worker.js), and the answer becomes tables and the step's picture.
// The result's element carries the peaks as data attributes, which the book's browser
// test reads back and compares with lab-10's own dry run.

const MODELS = {
  gpt2: {
    presets: {
      'GPT-2 small (124 M)': { d_model: 768, nhead: 12, layers: 12 },
      'GPT-2 medium (350 M)': { d_model: 1024, nhead: 16, layers: 24 },
      'GPT-2 large (774 M)': { d_model: 1280, nhead: 20, layers: 36 },
      'GPT-2 XL (1.5 B)': { d_model: 1600, nhead: 25, layers: 48 },
    },
    defaults: { vocab: 50257, dropout: 0, batch: 8, seq: 1024, optimizer: 'adamw' },
  },
  transformer: {
    presets: {
      "Tutorial 004's (d_model 256)": { d_model: 256, nhead: 8, layers: 6, ffn: 2048 },
      'nn.Transformer defaults (d_model 512)': { d_model: 512, nhead: 8, layers: 6, ffn: 2048 },
    },
    defaults: { dropout: 0.1, batch: 64, seq: 100, optimizer: 'adam' },
  },
};

// The GPU's memory as cudaMemGetInfo reports it, and cuBLAS's workspace there.
const GPUS = {
  'NVIDIA H100 80GB HBM3': { capacity: '85017493504', workspace: '32MiB' },
  'A GPU of 24 GiB': { capacity: '24GiB', workspace: '' },
  'A GPU of 48 GiB': { capacity: '48GiB', workspace: '' },
  'Another size': null,
};

const form = document.getElementById('calc-form');
const result = document.getElementById('calc-result');
const status = document.getElementById('calc-status');
const runButton = document.getElementById('calc-run');
const stopButton = document.getElementById('calc-stop');
const field = (name) => form.elements.namedItem(name);

// A run that takes longer than this is stopped, with a message: the tab stays usable.
const TIME_LIMIT_MS = 60000;

function fillSelect(select, names) {
  select.replaceChildren(...names.map((n) => new Option(n, n)));
}

function applyModel(model) {
  const m = MODELS[model];
  fillSelect(field('preset'), Object.keys(m.presets));
  applyPreset();
  for (const [k, v] of Object.entries(m.defaults)) field(k).value = v;
}

function applyPreset() {
  const m = MODELS[field('model').value];
  const p = m.presets[field('preset').value];
  if (p) for (const [k, v] of Object.entries(p)) field(k).value = v;
}

function applyGpu() {
  const g = GPUS[field('gpu').value];
  if (g) {
    field('capacity').value = g.capacity;
    field('workspace').value = g.workspace;
  }
}

function showFor() {
  const model = field('model').value;
  form.querySelectorAll('.transformer-only').forEach((e) => (e.hidden = model !== 'transformer'));
  form.querySelectorAll('.gpt2-only').forEach((e) => (e.hidden = model !== 'gpt2'));
  form.querySelectorAll('.dp-only').forEach((e) => (e.hidden = field('dp').value === 'none'));
}

// The form as lab-10 train's flags.
function flagsOfForm() {
  const v = (n) => String(field(n).value).trim();
  const model = v('model');
  const f = ['--model', model, '--d-model', v('d_model'), '--nhead', v('nhead'), '--layers', v('layers')];
  if (model === 'transformer') f.push('--ffn', v('ffn'));
  else f.push('--vocab', v('vocab'));
  f.push('--dropout', v('dropout'), '--batch', v('batch'), '--seq', v('seq'));
  if (v('accum') !== '1') f.push('--accum', v('accum'));
  if (v('amp') !== 'none') f.push('--amp', v('amp'));
  if (v('checkpoint') !== 'none') f.push('--checkpoint', v('checkpoint'));
  const share = Number(v('offload'));
  if (share > 0) f.push('--offload', '--offload-share', v('offload'));
  if (v('attention') !== 'fused') f.push('--attention', v('attention'));
  f.push('--optimizer', v('optimizer'));
  if (v('dp') !== 'none') f.push('--nproc', v('nproc'), `--${v('dp')}`);
  return f.join(' ');
}

function request() {
  return {
    flags: field('flags').value,
    capacity: field('capacity').value,
    gemm_workspace: field('workspace').value,
    alloc_conf: field('alloc').value,
    fit: field('fit').checked,
  };
}

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;
function bytes(n) {
  if (n >= GIB) return `${(n / GIB).toFixed(2)} GiB`;
  if (n >= MIB) return `${(n / MIB).toFixed(2)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(2)} KiB`;
  return `${n} B`;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  e.append(...children);
  return e;
}

function table(head, rows, numeric) {
  return el(
    'table',
    { class: 'calc-table' },
    el('thead', {}, el('tr', {}, ...head.map((h, i) => el('th', { class: numeric[i] ? 'num' : '' }, h)))),
    el('tbody', {}, ...rows.map((r) => el('tr', {}, ...r.map((c, i) => el('td', { class: numeric[i] ? 'num' : '' }, c))))),
  );
}

function showError(message) {
  result.replaceChildren(el('p', { class: 'calc-error', 'data-error': message }, message));
}

function showAnswer(a, ms) {
  const r = a.report;
  const capacity = Number(a.capacity_bytes);
  const fits = !r.oom;
  const parts = [];
  parts.push(
    el(
      'p',
      { class: fits ? 'calc-verdict fits' : 'calc-verdict oom' },
      fits
        ? `Fits: the step reserves at most ${bytes(r.peak_reserved)} of the GPU's ${bytes(capacity)}.`
        : 'Does not fit: the step runs out of memory.',
    ),
  );
  if (!fits) parts.push(el('pre', { class: 'calc-oom' }, r.oom));
  parts.push(
    table(
      ['', 'bytes', ''],
      [
        ['peak allocated', String(r.peak_allocated), bytes(r.peak_allocated)],
        ['peak reserved', String(r.peak_reserved), bytes(r.peak_reserved)],
        ['parameters', r.params.toLocaleString('en'), ''],
      ],
      [false, true, true],
    ),
  );
  const cats = Object.entries(r.by_category).filter(([, b]) => b > 0).sort((x, y) => y[1] - x[1]);
  if (cats.length > 0) {
    const total = cats.reduce((s, [, b]) => s + b, 0);
    parts.push(el('h3', {}, 'At the peak'));
    parts.push(
      table(
        ['category', 'allocated', 'share'],
        cats.map(([c, b]) => [c.replaceAll('_', ' '), bytes(b), `${((100 * b) / total).toFixed(1)} %`]),
        [false, true, true],
      ),
    );
  }
  if (a.fit) {
    parts.push(el('h3', {}, 'The largest micro-batch that fits'));
    const f = a.fit;
    parts.push(
      el(
        'p',
        { class: 'calc-fit', 'data-fit-batch': String(f.batch) },
        (f.batch > 0
          ? `${f.beyond_this_build ? 'At least ' : ''}${f.batch} (peak reserved ${bytes(f.peak_reserved)}); tried: ${f.trials.map(([b, ok]) => `${b} ${ok ? 'fits' : 'does not'}`).join(', ')}.`
          : 'Not even a micro-batch of 1: the model and its optimizer state alone need more.') +
          (f.beyond_this_build
            ? ` From a batch of ${f.beyond_this_build} on, a tensor has 4 GiB or more, more than the browser's 32-bit WebAssembly can describe: the command line searches further.`
            : ''),
      ),
    );
  }
  if (a.timeline_svg) {
    parts.push(el('h3', {}, 'The step over time'));
    const figure = el('div', { class: 'calc-timeline' });
    figure.innerHTML = a.timeline_svg;
    parts.push(figure);
  }
  parts.push(el('h3', {}, 'The same on the command line'));
  parts.push(el('pre', { class: 'calc-command' }, el('code', {}, a.command)));
  parts.push(el('p', { class: 'calc-took' }, `Answered in ${Math.round(ms)} ms.`));
  const out = el(
    'div',
    {
      class: 'calc-answer',
      'data-peak-allocated': String(r.peak_allocated),
      'data-peak-reserved': String(r.peak_reserved),
      'data-oom': fits ? '' : 'oom',
    },
    ...parts,
  );
  result.replaceChildren(out);
}

let worker = null;
let pending = null;
let next = 0;

function startWorker() {
  worker = new Worker(new URL('worker.js', import.meta.url), { type: 'module' });
  worker.onmessage = (event) => {
    const m = event.data;
    if (m.loadError) {
      showError(m.loadError);
      return;
    }
    if (m.loaded || !pending || m.id !== pending.id) return;
    clearTimeout(pending.timer);
    pending = null;
    busy(false);
    if (m.error) showError(m.error);
    else showAnswer(m.answer, m.ms);
  };
  worker.onerror = (e) => {
    e.preventDefault();
    if (pending) clearTimeout(pending.timer);
    pending = null;
    busy(false);
    showError(`the calculator stopped: ${e.message || 'its worker failed'}`);
    worker.terminate();
    startWorker();
  };
}

function busy(on) {
  runButton.disabled = on;
  stopButton.disabled = !on;
  status.textContent = on ? 'running the dry run…' : '';
  document.getElementById('calculator').dataset.busy = on ? 'yes' : 'no';
}

function stop(message) {
  if (!pending) return;
  clearTimeout(pending.timer);
  pending = null;
  worker.terminate();
  startWorker();
  busy(false);
  showError(message);
}

function calculate() {
  if (pending) stop('stopped: a new calculation replaced it');
  const id = ++next;
  const timer = setTimeout(
    () => stop(`stopped after ${TIME_LIMIT_MS / 1000} s: this configuration is too large to dry-run in a browser; run the command line instead`),
    TIME_LIMIT_MS,
  );
  pending = { id, timer };
  busy(true);
  worker.postMessage({ id, request: request() });
}

form.addEventListener('submit', (e) => {
  e.preventDefault();
  calculate();
});
stopButton.addEventListener('click', () => stop('stopped'));
form.addEventListener('change', (e) => {
  const name = e.target.name;
  if (name === 'flags' || name === 'capacity' || name === 'workspace' || name === 'alloc') return;
  if (name === 'model') applyModel(field('model').value);
  if (name === 'preset') applyPreset();
  if (name === 'gpu') applyGpu();
  showFor();
  field('flags').value = flagsOfForm();
});

fillSelect(field('gpu'), Object.keys(GPUS));
applyModel('gpt2');
applyGpu();
field('accum').value = 1;
field('offload').value = 0;
field('nproc').value = 2;
field('amp').value = 'none';
showFor();
field('flags').value = flagsOfForm();
startWorker();
busy(false);
calculate();
