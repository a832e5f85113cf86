//! Workshop exercises. The default build compiles the reference solutions, so CI
//! checks them; `--features exercises` swaps in the starter code, and the same tests
//! (`cargo test -p lab-12 --features exercises`) then grade the student's version.

mod reading;
pub use reading::Reading;

#[cfg(feature = "exercises")]
mod starter;
#[cfg(feature = "exercises")]
pub use starter::*;

#[cfg(not(feature = "exercises"))]
mod solutions;
#[cfg(not(feature = "exercises"))]
pub use solutions::*;
