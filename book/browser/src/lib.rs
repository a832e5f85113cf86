//! What the book's pages run in the reader's browser, compiled to WebAssembly: the
//! labs' own code, so that a page's answer is the command line's to the byte.
//!
//! - [`calculator`]: "will this training step fit?", answered by lab-10's dry run;
//! - [`viewer`]: "where did my memory go?", lab-03 view's page made from a snapshot
//!   the reader drops on the page;
//! - `wasm`: the functions the pages call (WebAssembly only).

pub mod calculator;
pub mod viewer;

#[cfg(target_arch = "wasm32")]
mod wasm;
