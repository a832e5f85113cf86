//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-07 --features exercises`.

use labs_core::DType;

// ANCHOR: exercise_update
/// Exercise 1: the gradient scaler's update rule. Given the scale, the count of good
/// steps in a row (`tracker`) and whether this step found an infinity or a NaN, return
/// the next `(scale, tracker)` for PyTorch's constants (`growth_factor`,
/// `backoff_factor`, `growth_interval`). A grown scale that is not finite is not taken.
pub fn next_scale(
    scale: f32,
    tracker: u32,
    found_inf: bool,
    growth_factor: f32,
    backoff_factor: f32,
    growth_interval: u32,
) -> (f32, u32) {
    let _ = (
        scale,
        tracker,
        found_inf,
        growth_factor,
        backoff_factor,
        growth_interval,
    );
    todo!("back off on an overflow; grow after growth_interval good steps in a row")
}
// ANCHOR_END: exercise_update

// ANCHOR: exercise_dtype
/// Exercise 2: the dtype the output of op `op` has inside `autocast(region)` when its
/// (floating-point) inputs are all `input`: the lower-precision list sends products to
/// the region's dtype, the float32 list sends the others to float32, and every other
/// op keeps its input's dtype. Ops: "matmul", "linear", "softmax", "log_softmax",
/// "layer_norm", "nll_loss", "mse_loss", "sum", "exp", "log", "relu", "add", "gelu",
/// "mean".
pub fn autocast_output_dtype(op: &str, input: DType, region: DType) -> DType {
    let _ = (op, input, region);
    todo!("which list is op on?")
}
// ANCHOR_END: exercise_dtype

// ANCHOR: exercise_underflow
/// Exercise 3: does `x` become zero when rounded to float16 (to nearest, ties to
/// even)? Work it out from float16's layout (its exponent bits and their bias, its
/// mantissa bits), without the `half` crate.
pub fn flushes_to_zero_in_f16(x: f32) -> bool {
    let _ = x;
    todo!("the smallest non-zero float16, and which values round to it rather than to 0")
}
// ANCHOR_END: exercise_underflow
