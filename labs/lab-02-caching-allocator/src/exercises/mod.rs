//! Workshop exercises. The default build compiles the reference solutions, so CI
//! checks them; `--features exercises` swaps in the starter code, and the same tests
//! (`cargo test -p lab-02 --features exercises`) then grade the student's version.

mod blocks;
mod segment;
pub use blocks::{FreeBlock, Split};
pub use segment::{Block, Segment};

#[cfg(feature = "exercises")]
mod starter;
#[cfg(feature = "exercises")]
pub use starter::*;

#[cfg(not(feature = "exercises"))]
mod solutions;
#[cfg(not(feature = "exercises"))]
pub use solutions::*;
