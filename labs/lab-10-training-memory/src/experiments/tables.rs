//! The chapter's tables from the measurements: memory in MiB (PyTorch's
//! `max_memory_allocated() / 2**20`), times in ms, PyTorch's columns beside ours only
//! when its figures were asked for, and a failed run a cell that says why.

use labs_core::alloc::Category;
use labs_core::table::Table;

use super::configs::Scale;
use super::pytorch::PyTorchRun;
use super::runs::Measurement;

const MIB: f64 = (1u64 << 20) as f64;

/// The tutorial's own printed peaks, in its "MB", which divides by 1024² (MiB).
pub const TUTORIAL_ONE_STEP_MIB: f64 = 2520.47;
pub const TUTORIAL_ACCUMULATED_MIB: f64 = 903.73;
/// The same, as the tutorial prints them.
const TUTORIAL_PRINTED: [&str; 2] = ["2,520.47 MB", "903.73 MB"];

pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
}

fn ratio(ours: f64, theirs: f64) -> String {
    if theirs > 0.0 {
        format!("{:.2}", ours / theirs)
    } else {
        "-".to_string()
    }
}

/// What a row shows in place of our figures when we have none.
fn ours_missing(m: &Measurement) -> Option<String> {
    match &m.ours {
        None if m.ours_error.is_some() => Some("error".to_string()),
        None => Some(format!(
            "does not fit (predicted {} MiB reserved)",
            mib(m.predicted.peak_reserved)
        )),
        Some(r) if r.oom.is_some() => Some("OOM".to_string()),
        Some(_) => None,
    }
}

/// One quantity of a row: ours, and with PyTorch's figures, theirs and the ratio. Where
/// we have no figures, the first quantity of the row (`explain`) says why.
fn triple(
    m: &Measurement,
    explain: bool,
    ours: impl Fn(&labs_train::TrainReport) -> Option<f64>,
    theirs: impl Fn(&super::pytorch::PyTorchFigures) -> Option<f64>,
    digits: usize,
) -> Vec<String> {
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    let o = m.ours_done().and_then(&ours);
    let mut cells = vec![match ours_missing(m) {
        Some(why) if explain => why,
        _ => fmt(o),
    }];
    if let Some(run) = &m.pytorch {
        match run {
            PyTorchRun::Measured(f) => {
                let t = theirs(f);
                cells.push(fmt(t));
                cells.push(match (o, t) {
                    (Some(o), Some(t)) => ratio(o, t),
                    _ => "-".to_string(),
                });
            }
            PyTorchRun::Failed { cell, .. } => {
                cells.push(cell.clone());
                cells.push("-".to_string());
            }
        }
    }
    cells
}

fn alloc_cells(m: &Measurement) -> Vec<String> {
    triple(
        m,
        true,
        |r| Some(r.peak_allocated as f64 / MIB),
        |f| Some(f.peak_allocated as f64 / MIB),
        1,
    )
}

fn reserved_cells(m: &Measurement) -> Vec<String> {
    triple(
        m,
        false,
        |r| Some(r.peak_reserved as f64 / MIB),
        |f| Some(f.peak_reserved as f64 / MIB),
        1,
    )
}

fn step_cells(m: &Measurement) -> Vec<String> {
    triple(m, false, |r| r.step_ms, |f| f.step_ms, 2)
}

/// The headers of the ours/PyTorch/ratio columns of `what`.
fn headers(what: &str, with_pytorch: bool) -> Vec<String> {
    match with_pytorch {
        false => vec![what.to_string()],
        true => vec![
            format!("{what} ours"),
            format!("{what} PyTorch"),
            format!("{what} ratio"),
        ],
    }
}

/// The reasons under a table for every PyTorch run that failed.
fn notes(rows: &[&Measurement]) -> String {
    let mut out = String::new();
    for m in rows {
        if let Some(PyTorchRun::Failed { cell, message }) = &m.pytorch {
            out.push_str(&format!(
                "- {}, PyTorch: {cell}: {message}\n",
                m.configuration.name
            ));
        }
        if let Some(error) = &m.ours_error {
            out.push_str(&format!("- {}, ours: {error}\n", m.configuration.name));
        }
        if let Some(oom) = m.ours.as_ref().and_then(|r| r.oom.as_ref()) {
            let first = oom.lines().next().unwrap_or("");
            out.push_str(&format!("- {}, ours: {first}\n", m.configuration.name));
        }
    }
    out
}

/// Section 1: the tutorial's one step against 4 accumulated micro-batches, batch first
/// (ours and PyTorch's), in the tutorial's own shape (ours), and its printed figures.
pub fn tutorial(device: &str, runs: &[&Measurement; 4], with_pytorch: bool) -> String {
    let [one, accum, shape_one, shape_accum] = runs;
    let mut head: Vec<String> = vec!["run".into(), "input".into()];
    head.extend(headers("alloc MiB", with_pytorch));
    head.extend(headers("reserved MiB", with_pytorch));
    head.extend(headers("step ms", with_pytorch));
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    let c = &one.config;
    let mut t = Table::new(
        format!(
            "1. Tutorial 004's experiment on {device}: nn.Transformer(d_model={}), Adam, \
             batch {} x seq {} in one step against {} accumulated micro-batches of {}",
            c.d_model, c.batch, c.seq, accum.config.accum, accum.config.batch
        ),
        &head,
    );
    for (label, m) in [
        ("one step", one),
        ("accumulated", accum),
        ("one step, tutorial's shape", shape_one),
        ("accumulated, tutorial's shape", shape_accum),
    ] {
        let k = &m.config;
        let input = match k.accum {
            1 => format!("{} seqs x {} positions", k.batch, k.seq),
            n => format!("{n} x ({} seqs x {} positions)", k.batch, k.seq),
        };
        // Rows PyTorch did not run (the tutorial's shape) leave its columns empty.
        let fill = |mut cells: Vec<String>| {
            if with_pytorch && m.pytorch.is_none() {
                cells.extend([String::new(), String::new()]);
            }
            cells
        };
        let mut row = vec![label.to_string(), input];
        row.extend(fill(alloc_cells(m)));
        row.extend(fill(reserved_cells(m)));
        row.extend(fill(step_cells(m)));
        t.row(row);
    }
    let mut out = format!("{t}");
    let peak = |m: &Measurement| m.ours_done().map(|r| r.peak_allocated as f64 / MIB);
    out.push_str(&format!(
        "Tutorial 004 prints {} and {} (its \"MB\" divides by 1024^2: MiB), a ratio of \
         {:.2}.\n",
        TUTORIAL_PRINTED[0],
        TUTORIAL_PRINTED[1],
        TUTORIAL_ONE_STEP_MIB / TUTORIAL_ACCUMULATED_MIB
    ));
    for (what, a, b) in [
        ("batch first", one, accum),
        ("the tutorial's shape", shape_one, shape_accum),
    ] {
        if let (Some(a), Some(b)) = (peak(a), peak(b)) {
            out.push_str(&format!(
                "Ours, {what}: {a:.1} MiB and {b:.1} MiB, a ratio of {:.2}.\n",
                a / b
            ));
        }
    }
    out.push_str(&format!(
        "The tutorial's model is not batch_first: its (64, 100, 256) input is 64 positions \
         of 100 sequences, and its micro-batches of 16 are 16 positions of the same 100. Ours \
         and ci/pytorch-train.py are batch_first ({} sequences of {} positions); the \
         tutorial's shape is measured here as {} sequences of {} (and of {}) positions.\n",
        one.config.batch,
        one.config.seq,
        shape_one.config.batch,
        shape_one.config.seq,
        shape_accum.config.seq
    ));
    out.push_str(&notes(&[one, accum, shape_one, shape_accum]));
    out
}

/// Sections 2 and 3: one row per technique, saving against the first row ("none").
pub fn techniques(title: String, rows: &[Measurement], with_pytorch: bool) -> String {
    let mut head: Vec<String> = vec!["technique".into()];
    head.extend(headers("alloc MiB", with_pytorch));
    head.extend(headers("reserved MiB", with_pytorch));
    head.extend(headers("step ms", with_pytorch));
    head.push("saving ours".into());
    if with_pytorch {
        head.push("saving PyTorch".into());
    }
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    let mut t = Table::new(title, &head);
    let base = rows.first();
    let ours_base = base.and_then(|b| b.ours_done()).map(|r| r.peak_allocated);
    let theirs_base = base
        .and_then(|b| b.pytorch.as_ref())
        .and_then(|p| p.figures())
        .map(|f| f.peak_allocated);
    let saving = |base: Option<u64>, v: Option<u64>| match (base, v) {
        (Some(b), Some(v)) if b > 0 => format!("{:+.1}%", 100.0 * (b as f64 - v as f64) / b as f64),
        _ => "-".to_string(),
    };
    for m in rows {
        let mut row = vec![m.configuration.label.clone()];
        row.extend(alloc_cells(m));
        row.extend(reserved_cells(m));
        row.extend(step_cells(m));
        row.push(saving(ours_base, m.ours_done().map(|r| r.peak_allocated)));
        if with_pytorch {
            let theirs = m.pytorch.as_ref().and_then(|p| p.figures());
            row.push(saving(theirs_base, theirs.map(|f| f.peak_allocated)));
        }
        t.row(row);
    }
    let refs: Vec<&Measurement> = rows.iter().collect();
    format!("{t}{}", notes(&refs))
}

/// Section 3's title: GPT-2 small, or which smaller GPT-2 stands in for it.
pub fn gpt2_title(device: &str, scale: Scale) -> String {
    format!("3. GPT-2 small on {device}: {}", scale.gpt2_description())
}

/// Section 4's columns: PyTorch's memory profiler's categories, then ours (the autocast
/// cache), then what is none of them.
const CATEGORIES: [Category; Category::COUNT] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Input,
    Category::Activation,
    Category::Temporary,
    Category::AutocastCache,
    Category::Other,
];

/// Section 4: the allocated peak of each tutorial run, by category.
pub fn categories(device: &str, rows: &[Measurement]) -> Table {
    let mut head = vec!["technique"];
    head.extend(CATEGORIES.iter().map(|c| c.name()));
    head.push("total");
    let mut t = Table::new(
        format!(
            "4. Where the memory goes on {device}: the tutorial's model, its allocated peak by \
             category (MiB)"
        ),
        &head,
    );
    for m in rows {
        let mut row = vec![m.configuration.label.clone()];
        match m.ours_done() {
            Some(r) => {
                for c in CATEGORIES {
                    row.push(mib(r.by_category.get(c.name()).copied().unwrap_or(0)));
                }
                row.push(mib(r.peak_allocated));
            }
            None => row.push(ours_missing(m).unwrap_or_default()),
        }
        t.row(row);
    }
    t
}

/// Section 5: the dry run's peaks against the measured ones.
pub fn predicted(device: &str, capacity: u64, rows: &[Measurement]) -> Table {
    let mut t = Table::new(
        format!(
            "5. Predicted before running: the dry run's peaks (a dry device of {}) against \
             those measured on {device} (MiB)",
            labs_core::format::bytes(capacity)
        ),
        &[
            "configuration",
            "alloc predicted",
            "alloc measured",
            "alloc error",
            "reserved predicted",
            "reserved measured",
            "reserved error",
        ],
    );
    let error = |p: u64, m: u64| match m {
        0 => "-".to_string(),
        m => format!("{:+.1}%", 100.0 * (p as f64 - m as f64) / m as f64),
    };
    for m in rows {
        let p = &m.predicted;
        let mut row = vec![m.configuration.name.clone(), mib(p.peak_allocated)];
        match m.ours_done() {
            Some(r) => {
                row.push(mib(r.peak_allocated));
                row.push(error(p.peak_allocated, r.peak_allocated));
                row.push(mib(p.peak_reserved));
                row.push(mib(r.peak_reserved));
                row.push(error(p.peak_reserved, r.peak_reserved));
            }
            None => {
                let why = ours_missing(m).unwrap_or_default();
                row.extend([
                    why,
                    "-".into(),
                    mib(p.peak_reserved),
                    "-".into(),
                    "-".into(),
                ]);
            }
        }
        t.row(row);
    }
    t
}

/// Section 6: how much of offload's copying the step's compute hid, per offloaded run
/// (everything, and a share). The copies' busy time comes from events on the copy
/// stream; what they cost the step is the offloaded step's time less the step without
/// offload; the rest was hidden behind compute. At most the step's compute can hide
/// them: a step whose copies outlast its compute is bound by the copies, and the
/// column after says how much of what could be hidden was. `None` without an
/// offloaded run that timed its copies.
pub fn offload_overlap(device: &str, families: &[&[Measurement]]) -> Option<Table> {
    let mut t = Table::new(
        format!(
            "6. Offload's copies against compute on {device}: the copy stream's busy time per \
             step, what offload added to the step, and what compute hid"
        ),
        &[
            "run",
            "saved MiB",
            "copies out + back ms",
            "step ms none",
            "step ms offload",
            "added ms",
            "hidden, of copy time",
            "hidden, of the most compute can hide",
            "PyTorch: added ms",
        ],
    );
    let mut any = false;
    for rows in families {
        let Some(none) = rows
            .iter()
            .find(|m| m.configuration.name.ends_with("-none"))
        else {
            continue;
        };
        let offloaded = rows
            .iter()
            .filter(|m| m.configuration.name.contains("-offload"));
        for offload in offloaded {
            if let Some(row) = overlap_row(none, offload) {
                t.row(row);
                any = true;
            }
        }
    }
    any.then_some(t)
}

/// One row of section 6: `offload` against the run without offload, `none`.
fn overlap_row(none: &Measurement, offload: &Measurement) -> Option<[String; 9]> {
    let (plain, off) = (none.ours_done()?, offload.ours_done()?);
    let (compute, step, o) = (plain.step_ms?, off.step_ms?, off.offload?);
    let (out, back, copy) = (o.copy_out_ms?, o.copy_back_ms?, o.copy_ms?);
    if copy <= 0.0 {
        return None;
    }
    let added = step - compute;
    let hidden = (copy - added).clamp(0.0, copy);
    let pytorch_added = match (
        none.pytorch.as_ref().and_then(|p| p.figures()),
        offload.pytorch.as_ref().and_then(|p| p.figures()),
    ) {
        (Some(a), Some(b)) => match (a.step_ms, b.step_ms) {
            (Some(a), Some(b)) => format!("{:.2}", b - a),
            _ => "-".to_string(),
        },
        _ => "-".to_string(),
    };
    let family = offload.configuration.family.name();
    Some([
        format!("{family} {}", offload.configuration.label),
        mib(plain.peak_allocated.saturating_sub(off.peak_allocated)),
        format!("{out:.2} + {back:.2} = {copy:.2}"),
        format!("{compute:.2}"),
        format!("{step:.2}"),
        format!("{added:.2}"),
        format!("{:.0}%", 100.0 * hidden / copy),
        format!("{:.0}%", 100.0 * hidden / copy.min(compute)),
        pytorch_added,
    ])
}
