//! Lab 6.
