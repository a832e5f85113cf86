//! The formula beside the dry run and the GPU: what each counts as activations, the
//! difference split into its named parts, and the tables `lab-10 formula` prints.

use anyhow::Result;
use labs_core::alloc::Category;
use labs_core::table::Table;
use labs_core::{DType, Device};
use labs_train::{AmpMode, TrainConfig, Trainer};

use super::*;

/// What the dry run counts as activations for `c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// After the first micro-batch's forward pass and loss, before its backward.
    pub after_forward: u64,
    /// Of `after_forward`, what blocks hold beyond their requests rounded to 512 bytes:
    /// the rest of a segment too small to split off (under 1 MiB in the large pool).
    pub unsplit: u64,
    /// At the run's allocated peak (the report's `by_category`).
    pub at_peak: u64,
}

/// The `activation` bytes after one forward pass and loss of `c` on `device` (as
/// `Trainer::micro_batch` runs it, before its backward), and what of them blocks hold
/// beyond their requests rounded to 512 bytes.
pub fn activation_after_forward(c: &TrainConfig, device: &Device) -> Result<(u64, u64)> {
    let trainer = Trainer::new(c, device)?;
    let batch = Batch::random(c, 0, 0, device)?;
    let _backend = sdpa_kernel(match c.attention {
        AttentionMode::Naive => SdpaBackend::Math,
        AttentionMode::Fused => SdpaBackend::Fused,
    });
    let _loss = {
        let _autocast = match c.amp {
            AmpMode::None => None,
            AmpMode::Bf16 => Some(autocast(DType::BF16)?),
            AmpMode::F16 => Some(autocast(DType::F16)?),
        };
        trainer.model.loss(&batch)?
    };
    let unsplit = (device.allocator()?.live_blocks().iter())
        .filter(|b| b.category == Category::Activation)
        .map(|b| b.size - round_size(b.requested, 0))
        .sum();
    Ok((activation_now(device)?, unsplit))
}

/// The `activation` category's bytes allocated now.
pub fn activation_now(device: &Device) -> Result<u64> {
    let by_category = device.allocator()?.memory_by_category();
    Ok(by_category
        .iter()
        .find(|(c, _)| *c == Category::Activation)
        .map_or(0, |(_, s)| s.current))
}

/// The activation category at the allocated peak of a whole run of `c` on `device`;
/// `None` when it ran out of memory.
pub fn activation_at_peak(c: &TrainConfig, device: &Device) -> Result<Option<u64>> {
    let report = labs_train::run(c, device)?;
    if report.oom.is_some() {
        return Ok(None);
    }
    Ok(Some(
        report.by_category.get("activation").copied().unwrap_or(0),
    ))
}

/// A dry device large enough for any configuration here, with `like`'s products'
/// workspace.
pub fn dry_device(like: &Device) -> Result<Device> {
    Ok(like.dry_twin(1 << 40)?)
}

/// The dry run's two figures for `c`.
pub fn measure_dry(c: &TrainConfig, like: &Device) -> Result<Measured> {
    let (after_forward, unsplit) = activation_after_forward(c, &dry_device(like)?)?;
    let at_peak = activation_at_peak(c, &dry_device(like)?)?
        .expect("a dry device of 1 TiB holds every configuration here");
    Ok(Measured {
        after_forward,
        unsplit,
        at_peak,
    })
}

/// The formula beside the dry run (and a GPU) for one configuration.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub name: String,
    pub config: TrainConfig,
    pub formula: Formula,
    pub dry: Measured,
    /// The GPU's activation category at its peak, when run on one (`None` inside:
    /// it did not fit).
    pub gpu: Option<Option<u64>>,
}

impl Comparison {
    /// `L · per layer`, unrounded: the formula.
    pub fn formula_bytes(&self) -> i64 {
        self.formula.layers_bytes(&self.config)
    }

    /// The allocator's sizes against the layers' tensors: each rounded to 512 bytes,
    /// and blocks holding the unsplit rest of a segment.
    pub fn rounding(&self) -> i64 {
        let c = &self.config;
        let layer: i64 = (self.formula.per_layer.iter())
            .map(|t| t.rounded(c) - t.bytes(c))
            .sum();
        self.formula.layers as i64 * layer + self.dry.unsplit as i64
    }

    /// Backward's work before the peak: tensors it freed (negative) and, with
    /// checkpointing, a layer it recomputed (positive).
    pub fn backward_by_peak(&self) -> i64 {
        self.dry.at_peak as i64 - self.dry.after_forward as i64
    }

    /// What the terms do not account for after the forward pass, the allocator's
    /// sizes aside (0 where the formula is exact).
    pub fn unexplained(&self) -> i64 {
        self.dry.after_forward as i64
            - self.formula.rounded_bytes(&self.config)
            - self.dry.unsplit as i64
    }

    /// The dry run at the peak less the formula.
    pub fn difference(&self) -> i64 {
        self.dry.at_peak as i64 - self.formula_bytes()
    }

    /// The difference, term by term.
    pub fn why(&self) -> String {
        let c = &self.config;
        let mut parts = Vec::new();
        let outside = self.formula.outside_bytes(c);
        if outside != 0 {
            let largest = self.formula.largest_outside(c).expect("an outside term");
            parts.push(format!(
                "outside the layers {} (of which {} {})",
                signed_mib(outside),
                largest.name,
                signed_mib(largest.rounded(c))
            ));
        }
        parts.push(format!(
            "the allocator's block sizes {}",
            signed_mib(self.rounding())
        ));
        let backward = self.backward_by_peak();
        // Backward frees saved tensors as it goes, and a checkpointed layer's
        // recomputation makes them again; with accumulation the peak comes in a later
        // micro-batch, whose blocks may be cut from other segments.
        let what = if self.config.accum > 1 {
            "the peak's micro-batch against the first one's forward"
        } else {
            "backward by the peak (freed -, recomputed +)"
        };
        parts.push(format!("{what} {}", signed_mib(backward)));
        parts.push(format!(
            "not in the terms {}",
            signed_mib(self.unexplained())
        ));
        if let Some(Some(gpu)) = self.gpu {
            let off = gpu as i64 - self.dry.at_peak as i64;
            parts.push(format!("the GPU against the dry run {}", signed_mib(off)));
        }
        // A part of less than 0.05 MiB either way says nothing at this precision.
        parts.retain(|p| !p.ends_with("+0.0") && !p.ends_with("-0.0"));
        if parts.is_empty() {
            return "none".to_string();
        }
        parts.join("; ")
    }
}

fn signed_mib(bytes: i64) -> String {
    format!("{:+.1}", bytes as f64 / MIB)
}

fn mib(bytes: i64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
}

/// The formula's table of one configuration's terms: one row per saved tensor.
pub fn terms_table(c: &TrainConfig, f: &Formula) -> Table {
    let title = format!(
        "The activation formula's terms (s {} b {} h {} a {} f {} V {} L {}, e = {} bytes)",
        c.seq,
        c.batch,
        c.d_model,
        c.nhead,
        c.ffn,
        c.vocab,
        f.layers,
        bytes_per_element(c.amp)
    );
    let mut t = Table::new(title, &["part", "saved tensor", "bytes", "count", "MiB"]);
    for term in f.per_layer.iter().chain(&f.outside) {
        t.row([
            term.part.to_string(),
            term.name.to_string(),
            format!("{}·{}", term.coef, term.unit.symbol()),
            term.count.to_string(),
            format!("{:.2}", term.bytes(c) as f64 / MIB),
        ]);
    }
    t
}

/// The formula per layer, and for `L` layers beside the dry run's activation category
/// (and the GPU's), with what makes up the difference.
pub fn comparison_table(rows: &[Comparison], gpu: Option<&str>) -> Table {
    let mut headers = vec![
        "configuration",
        "one layer (bytes)",
        "one layer MiB",
        "L",
        "formula MiB",
        "dry run after forward MiB",
        "dry run at the peak MiB",
    ];
    if gpu.is_some() {
        headers.push("GPU at the peak MiB");
    }
    headers.push("peak - formula MiB");
    let on = match gpu {
        Some(name) => format!("the dry run and {name}"),
        None => "the dry run".to_string(),
    };
    let title = format!(
        "The activation formula (s sequence, b micro-batch, h d_model, a heads, f feed-forward \
         width; the tutorial's layer is one encoder and one decoder layer; formula: L x one \
         layer) against the activation category of {on}"
    );
    let mut t = Table::new(title, &headers);
    for r in rows {
        let mut cells = vec![
            r.name.clone(),
            r.formula.per_layer_text(),
            mib(r.formula.per_layer_bytes(&r.config)),
            r.formula.layers.to_string(),
            mib(r.formula_bytes()),
            mib(r.dry.after_forward as i64),
            mib(r.dry.at_peak as i64),
        ];
        if gpu.is_some() {
            cells.push(match r.gpu {
                Some(Some(b)) => mib(b as i64),
                _ => "does not fit".to_string(),
            });
        }
        cells.push(signed_mib(r.difference()));
        t.row(cells);
    }
    t
}

/// What makes up each row's difference (peak - formula), a line per configuration:
/// printed under [`comparison_table`], whose column it would be too wide for.
pub fn differences(rows: &[Comparison]) -> String {
    let mut out = String::from("peak - formula, by configuration:\n");
    for r in rows {
        out.push_str(&format!("  {}: {}\n", r.name, r.why()));
    }
    out
}

/// The chapter's configurations the formula covers (every technique but selective
/// checkpointing and offload, and f16, whose bytes are bf16's), at the GPU's sizes.
pub fn chapter_configurations() -> Result<Vec<(String, TrainConfig)>> {
    use crate::experiments::configs::{configurations, Scale};
    let mut out = Vec::new();
    for c in configurations(Scale::Full) {
        let config = c.train_config()?;
        let covered = formula(&config).is_ok() && config.amp != AmpMode::F16;
        if covered {
            out.push((c.name, config));
        }
    }
    Ok(out)
}

/// `c` by formula, on the dry run, and on `device` when it is a GPU.
pub fn compare(name: &str, c: &TrainConfig, device: &Device) -> Result<Comparison> {
    let formula = formula(c)?;
    let dry = measure_dry(c, device)?;
    let gpu = if device.is_cuda() {
        let at_peak = activation_at_peak(c, device)?;
        device.allocator()?.empty_cache()?;
        Some(at_peak)
    } else {
        None
    };
    Ok(Comparison {
        name: name.to_string(),
        config: c.clone(),
        formula,
        dry,
        gpu,
    })
}
