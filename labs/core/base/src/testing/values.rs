//! Comparing values with a reference the same way in every test suite, and the one lock
//! of the tests that read the device's memory counters.

use std::sync::{Mutex, MutexGuard};

/// Serialises the tests of one test binary that read the device's memory counters or
/// its kernel counts (Rust runs a binary's tests on threads of one process, which share
/// the device). A test that panicked while holding it does not poison it for the next.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The largest `|got - want| / (1 + |want|)`: a relative error that stays finite at zero.
pub fn max_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "max_error: lengths");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
        .fold(0.0, f64::max)
}

/// Asserts `|got - want| <= atol + rtol |want|` element by element (NaN matches NaN
/// only), the lengths being equal; a failure names `what` and the element.
pub fn assert_close<G, W>(what: &str, got: &[G], want: &[W], rtol: f64, atol: f64)
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w): (f64, f64) = (g.into(), w.into());
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= atol + rtol * w.abs();
        assert!(ok, "{what}: element {i} is {g}, expected {w}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_values_pass_and_far_ones_name_the_element() {
        assert_close("same", &[1.0f32, f32::NAN], &[1.0f64, f64::NAN], 0.0, 0.0);
        assert_close("within", &[1.001f32], &[1.0f32], 1e-2, 0.0);
        let far = std::panic::catch_unwind(|| {
            assert_close("far", &[1.0f32, 2.5], &[1.0f64, 2.0], 0.1, 0.0)
        });
        let message = *far.unwrap_err().downcast::<String>().unwrap();
        assert!(
            message.contains("far: element 1 is 2.5, expected 2"),
            "{message}"
        );
        assert!(
            std::panic::catch_unwind(|| assert_close("nan", &[f32::NAN], &[0.0f32], 1.0, 1.0))
                .is_err()
        );
        assert!(std::panic::catch_unwind(|| assert_close(
            "len",
            &[0.0f32],
            &[0.0f32, 0.0],
            1.0,
            1.0
        ))
        .is_err());
    }

    #[test]
    fn max_error_is_relative_above_one_and_absolute_below() {
        assert_eq!(max_error(&[3.0, 0.5], &[1.0, 0.0]), 1.0);
        assert_eq!(max_error(&[], &[]), 0.0);
    }
}
