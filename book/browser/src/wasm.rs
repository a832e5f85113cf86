//! What the pages call: JSON out, a request's JSON or a file's bytes in
//! (`wasm-bindgen` writes the pages' side). A panic is an error line, not a dead page.

use wasm_bindgen::prelude::wasm_bindgen;

fn guarded(f: impl FnOnce() -> String + std::panic::UnwindSafe, what: &str) -> String {
    std::panic::catch_unwind(f).unwrap_or_else(|_| {
        serde_json::json!({ "error": format!("{what} failed unexpectedly") }).to_string()
    })
}

/// [`crate::calculator::answer_json`].
#[wasm_bindgen]
pub fn answer(request: &str) -> String {
    guarded(|| crate::calculator::answer_json(request), "the dry run")
}

/// [`crate::viewer::page_json`].
#[wasm_bindgen]
pub fn view_page(bytes: &[u8], name: &str) -> String {
    guarded(
        || crate::viewer::page_json(bytes, name),
        "reading the snapshot",
    )
}
