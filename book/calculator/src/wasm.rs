//! What the page calls: one function, a request's JSON in and the answer's JSON out
//! (`wasm-bindgen` writes the page's side).

use wasm_bindgen::prelude::wasm_bindgen;

/// [`super::answer_json`]; a panic in the dry run is an error line, not a dead page.
#[wasm_bindgen]
pub fn answer(request: &str) -> String {
    std::panic::catch_unwind(|| super::answer_json(request))
        .unwrap_or_else(|_| r#"{"error":"the dry run failed unexpectedly"}"#.to_string())
}
