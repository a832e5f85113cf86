//! Experiment 3: an operation on tensors of two devices is an error, PyTorch's, rather
//! than a silent copy: moving data between devices is always the program's choice.

use labs_core::{Device, Result, Tensor};

/// The error of adding a tensor on `a` to one on `b`, as its message.
pub fn message(a: &Device, b: &Device) -> Result<String> {
    // ANCHOR: mismatch
    let x = Tensor::full(&[4], 1.0f32, a)?;
    let y = Tensor::full(&[4], 2.0f32, b)?;
    let err = x
        .add(&y)
        .expect_err("tensors of two devices cannot be added");
    // ANCHOR_END: mismatch
    Ok(err.to_string())
}

/// The section as text: the attempt, the error, and the fix.
pub fn report(a: &Device, b: &Device) -> Result<String> {
    Ok(format!(
        "3. An operation across devices\n  x on {a} + y on {b}\n  Error: {}\n  \
         (the fix: move one of them, x + y.to({a}))\n",
        message(a, b)?
    ))
}
