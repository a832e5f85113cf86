#!/usr/bin/env bash
# Builds what the book's pages run in the browser (book/browser: the calculator, lab-10's
# dry run, and the snapshot viewer's reader, lab-03 view's) as WebAssembly into
# book/src/tools/pkg, where the pages load it: `cargo build` for
# wasm32-unknown-unknown, then wasm-bindgen for the page's side. Run before `mdbook
# build`; installs the target and wasm-bindgen (the version Cargo.lock pins) if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
[ -n "$version" ] || { echo "build-browser: no wasm-bindgen in Cargo.lock" >&2; exit 1; }
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  echo "== installing the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown
fi
if ! wasm-bindgen --version 2>/dev/null | grep -qF "$version"; then
  echo "== installing wasm-bindgen-cli $version"
  cargo install --quiet wasm-bindgen-cli --version "$version"
fi
target_dir=${CARGO_TARGET_DIR:-target}
cargo build --quiet -p labs-browser --target wasm32-unknown-unknown --profile wasm
rm -rf book/src/tools/pkg
wasm-bindgen --target web --no-typescript --remove-name-section --remove-producers-section --out-dir book/src/tools/pkg \
  "$target_dir/wasm32-unknown-unknown/wasm/labs_browser.wasm"
echo "build-browser: book/src/tools/pkg ($(du -k book/src/tools/pkg/labs_browser_bg.wasm | cut -f1) KiB of WebAssembly)"
