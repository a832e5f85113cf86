//! What a collective leaves in each rank's output, computed on the host from every
//! rank's input: the simulated transport's arithmetic. Floats are combined in float64
//! and rounded once to the dtype; integers wrap, as on the GPU.

use half::{bf16, f16};

use crate::backend::{CollectiveCall, CollectiveKind, ReduceOp};
use crate::dtype::{as_bytes, from_bytes, DType};
use crate::error::{Error, Result};

enum Values {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

fn decode(dtype: DType, bytes: &[u8]) -> Values {
    match dtype {
        DType::F32 => Values::Float(
            from_bytes::<f32>(bytes)
                .into_iter()
                .map(f64::from)
                .collect(),
        ),
        DType::F16 => Values::Float(
            from_bytes::<f16>(bytes)
                .into_iter()
                .map(f64::from)
                .collect(),
        ),
        DType::BF16 => Values::Float(
            from_bytes::<bf16>(bytes)
                .into_iter()
                .map(f64::from)
                .collect(),
        ),
        DType::I32 => Values::Int(
            from_bytes::<i32>(bytes)
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        DType::I64 => Values::Int(from_bytes::<i64>(bytes)),
        DType::U8 => Values::Int(bytes.iter().map(|&b| i64::from(b)).collect()),
    }
}

fn encode(dtype: DType, values: Values) -> Vec<u8> {
    match values {
        Values::Float(v) => match dtype {
            DType::F32 => as_bytes(&v.iter().map(|&x| x as f32).collect::<Vec<_>>()).to_vec(),
            DType::F16 => {
                as_bytes(&v.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>()).to_vec()
            }
            _ => as_bytes(&v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>()).to_vec(),
        },
        // `as` truncates to the dtype's width: the wrapping arithmetic of the GPU.
        Values::Int(v) => match dtype {
            DType::I32 => as_bytes(&v.iter().map(|&x| x as i32).collect::<Vec<_>>()).to_vec(),
            DType::I64 => as_bytes(&v).to_vec(),
            _ => v.iter().map(|&x| x as u8).collect(),
        },
    }
}

/// Element-wise `op` over every rank's `inputs` (all of one length).
fn reduce(op: ReduceOp, dtype: DType, inputs: &[&[u8]]) -> Vec<u8> {
    let world = inputs.len();
    let mut decoded = inputs.iter().map(|b| decode(dtype, b));
    let first = decoded.next().expect("a group has at least one rank");
    let combined = match first {
        Values::Float(mut acc) => {
            for v in decoded {
                let Values::Float(v) = v else { unreachable!() };
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => *a + x,
                        ReduceOp::Product => *a * x,
                        ReduceOp::Max => a.max(x),
                        ReduceOp::Min => a.min(x),
                    };
                }
            }
            if op == ReduceOp::Avg {
                acc.iter_mut().for_each(|a| *a /= world as f64);
            }
            Values::Float(acc)
        }
        Values::Int(mut acc) => {
            for v in decoded {
                let Values::Int(v) = v else { unreachable!() };
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(x),
                        ReduceOp::Product => a.wrapping_mul(x),
                        ReduceOp::Max => (*a).max(x),
                        ReduceOp::Min => (*a).min(x),
                    };
                }
            }
            Values::Int(acc)
        }
    };
    encode(dtype, combined)
}

/// Rank `rank`'s output bytes of `call`, given every rank's input bytes in rank order.
pub(super) fn output_of(call: &CollectiveCall, rank: usize, inputs: &[Vec<u8>]) -> Result<Vec<u8>> {
    let all: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    Ok(match call.kind {
        CollectiveKind::AllReduce(op) => reduce(op, call.dtype, &all),
        CollectiveKind::Broadcast { root } => all
            .get(root)
            .ok_or_else(|| Error::InvalidArgument(format!("broadcast: no rank {root}")))?
            .to_vec(),
        CollectiveKind::AllGather => all.concat(),
        CollectiveKind::ReduceScatter(op) => {
            let chunk = call.count * call.dtype.size();
            let reduced = reduce(op, call.dtype, &all);
            reduced[rank * chunk..(rank + 1) * chunk].to_vec()
        }
    })
}
