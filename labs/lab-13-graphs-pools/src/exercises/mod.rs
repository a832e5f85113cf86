//! Workshop exercises. The default build compiles the reference solutions, so CI
//! checks them; `--features exercises` swaps in the starter code, and the same tests
//! (`cargo test -p lab-13 --features exercises`) then grade the student's version.

#[cfg(feature = "exercises")]
mod starter;
#[cfg(feature = "exercises")]
pub use starter::*;

#[cfg(not(feature = "exercises"))]
mod solutions;
#[cfg(not(feature = "exercises"))]
pub use solutions::*;
