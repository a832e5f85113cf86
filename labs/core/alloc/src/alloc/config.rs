//! `LABS_ALLOC_CONF`: the allocator's knobs, in PyTorch's `PYTORCH_CUDA_ALLOC_CONF`
//! syntax (`key:value,key:value`), so that a PyTorch user's setting means the same here.

use crate::error::{Error, Result};
use crate::format::quote;

pub use super::divisions::Divisions;

/// Environment variable holding the configuration of every device's allocator.
pub const ENV_ALLOC_CONF: &str = "LABS_ALLOC_CONF";

const MIB: u64 = 1 << 20;

/// The default of `max_mapping_mb`: 16 MiB, eight pages of 2 MiB. Peak reserved over
/// peak requested on the traces of `data/traces` (exact, the same on every backend):
/// 2 MiB 1.002-1.021, 16 MiB 1.005-1.021, 64 MiB 1.008-1.050, one mapping per block
/// 1.008-1.182, where PyTorch's best mode gives 1.017-1.132; on the checkpointing loops
/// of `data/synthetic`, 16 MiB 1.031-1.044 and 64 MiB 1.110-1.134, against PyTorch's
/// best 1.110-1.124. Time follows the number of mappings: on an H100, 64 MiB replays
/// the traces 1.0-4.3 times faster than 16 MiB, 2 MiB 2-7 times slower. `lab-02
/// mappings` measures it; chapter 2 has the tables.
///
/// Why no size does both: a mapping costs about what a `cuMemAlloc` does (in a replay
/// on an H100, `cuMemCreate` 16 µs, `cuMemMap` 2 µs, `cuMemSetAccess` 26-36 µs per
/// mapping in its range, against about 50 µs per fixed segment), so staying near the
/// fixed segments' time leaves room for about as many mappings as they have segments:
/// one per block, a row whose memory is pinned two ways: by the page a block shares
/// with its neighbour (a 48 MiB mapping stays while the next block uses its last page)
/// and by smaller blocks reusing part of an idle mapping. Mapping those edge pages
/// apart and remapping an idle mapping that a smaller block would use in part was
/// tried: 1.004-1.024 on every trace and loop but accum4x16 (1.043), the tightest of
/// all, at 1-3.6 times the default's mappings and 3.5-30 times its synchronisations
/// (remapping needs idle memory safe now).
pub const DEFAULT_MAX_MAPPING: u64 = 16 * MIB;

// ANCHOR: alloc_backend
/// Where allocations come from (`backend:NAME`, PyTorch's key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocBackend {
    /// The caching allocator (`backend:native`, the default).
    #[default]
    Native,
    /// No cache of the labs' own: every request is a `cuMemAllocAsync` from the
    /// driver's stream-ordered pool, every free a `cuMemFreeAsync`
    /// (`backend:cudaMallocAsync`; see `stream_ordered.rs`).
    CudaMallocAsync,
}
// ANCHOR_END: alloc_backend

impl AllocBackend {
    /// The name `backend:` takes.
    pub fn name(self) -> &'static str {
        match self {
            AllocBackend::Native => "native",
            AllocBackend::CudaMallocAsync => "cudaMallocAsync",
        }
    }
}

// ANCHOR: config
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The caching allocator, or the driver's stream-ordered pool (`backend:`). With
    /// the pool, the caching knobs below are refused (`Config::parse`).
    pub backend: AllocBackend,
    /// Free blocks at least this large are never split for smaller requests (raw
    /// segments only: a free range of an expandable segment costs nothing, so carving
    /// it up cannot strand memory). `None`: no limit.
    pub max_split_size: Option<u64>,
    /// When reserved memory passes this fraction of the limit, cached segments are
    /// released before new memory is taken from the driver.
    pub garbage_collection_threshold: Option<f64>,
    /// Round requests above 512 B up to one of N steps between powers of two, N chosen
    /// by the request's size (0: plain 512-byte rounding).
    pub roundup_power2_divisions: Divisions,
    /// Segments are virtual ranges whose pages are mapped on demand, instead of fixed
    /// `cuMemAlloc` blocks. As in PyTorch, mapped pages stay where they are until
    /// `empty_cache` (or memory runs out); with `recycle_idle_pages` they also move.
    pub expandable_segments: bool,
    /// Expandable segments only (the labs' own knob, `recycle_idle_pages:True`, part of
    /// `preset:labs`): once reserved memory reaches its high-water mark, idle pages
    /// move to wherever memory is needed instead of reserved memory growing, and a free
    /// range of an expandable segment is never oversize for `max_split_size_mb` (it
    /// strands nothing). See `pages.rs`.
    pub recycle_idle_pages: bool,
    /// The most memory one driver mapping of an expandable segment covers, in bytes
    /// (the labs' own knob, `max_mapping_mb:N`; rounded down to whole pages, at least
    /// one). Each mapping costs tens of microseconds of driver time, and memory is
    /// given back a whole mapping at a time: larger mappings cost less time and strand
    /// more memory (see `DEFAULT_MAX_MAPPING`).
    pub max_mapping: u64,
    /// The share of the device's memory this process may reserve.
    pub per_process_memory_fraction: f64,
    /// Freed blocks are kept whole for the next request of their size (the labs' own
    /// knob, `park_freed_blocks:False` to compare; see `parked.rs`).
    pub park_freed_blocks: bool,
    /// Where to write a memory snapshot when an allocation fails for good (the labs'
    /// own knob, `oom_snapshot:PATH`; PyTorch users attach an out-of-memory observer
    /// that calls `_dump_snapshot`).
    pub oom_snapshot: Option<String>,
}
// ANCHOR_END: config

// ANCHOR: config_default
impl Default for Config {
    /// PyTorch's defaults: fixed segments, no knobs, so that every figure a lab prints
    /// is the one PyTorch prints for the same program. (Parking freed blocks changes
    /// no decision, only how fast the same one is made: see `parked.rs`.) The labs'
    /// own policy is one key away: `preset:labs` ([`Config::labs`]).
    fn default() -> Self {
        Config {
            backend: AllocBackend::Native,
            max_split_size: None,
            garbage_collection_threshold: None,
            roundup_power2_divisions: Divisions::default(),
            expandable_segments: false,
            recycle_idle_pages: false,
            max_mapping: DEFAULT_MAX_MAPPING,
            per_process_memory_fraction: 1.0,
            park_freed_blocks: true,
            oom_snapshot: None,
        }
    }
}
// ANCHOR_END: config_default

impl Config {
    /// PyTorch's defaults (the same as [`Config::default`]; `preset:pytorch`).
    pub fn pytorch_native() -> Self {
        Config::default()
    }

    /// PyTorch's `backend:cudaMallocAsync`: the driver's stream-ordered pool instead of
    /// the caching allocator.
    pub fn cuda_malloc_async() -> Self {
        Config {
            backend: AllocBackend::CudaMallocAsync,
            ..Config::default()
        }
    }

    /// The configuration in `LABS_ALLOC_CONF`, or the default when unset.
    pub fn from_env() -> Result<Self> {
        match std::env::var(ENV_ALLOC_CONF) {
            Ok(v) => Config::parse(&v).map_err(|e| match e {
                Error::InvalidArgument(m) => {
                    Error::InvalidArgument(format!("{ENV_ALLOC_CONF}: {m}"))
                }
                e => e,
            }),
            Err(_) => Ok(Config::default()),
        }
    }

    // ANCHOR: config_labs
    /// The labs' own policy, by name (`preset:labs`): expandable segments whose idle
    /// pages move to where memory is needed once reserved memory reaches its high-water
    /// mark, except pages whose moving a training loop has shown to be wasted (see
    /// `pages.rs`). Chosen by replaying the real traces in `data/traces`: peak reserved
    /// stays within about 2% of peak requested, where fixed segments strand 10-50%
    /// (`lab-02` prints the comparison, with the driver calls each trace cost).
    pub fn labs() -> Self {
        Config {
            expandable_segments: true,
            recycle_idle_pages: true,
            max_mapping: DEFAULT_MAX_MAPPING,
            ..Config::default()
        }
    }
    // ANCHOR_END: config_labs

    /// The preset this configuration starts from, for output headers: `labs` or
    /// `pytorch` when it is one of them exactly, else `None` (its keys then say it).
    pub fn preset_name(&self) -> Option<&'static str> {
        if *self == Config::labs() {
            Some("labs")
        } else if *self == Config::pytorch_native() {
            Some("pytorch")
        } else {
            None
        }
    }

    /// One line for a lab's output header: "allocator: PyTorch's defaults",
    /// "allocator: preset labs", or the keys that differ from PyTorch's defaults.
    pub fn describe(&self) -> String {
        match self.preset_name() {
            Some("pytorch") => "allocator: PyTorch's defaults".to_string(),
            Some(_) => "allocator: preset labs".to_string(),
            None => format!("allocator: {}", self.to_conf_string()),
        }
    }

    /// The configuration a preset names: `labs` ([`Config::labs`]) or `pytorch`
    /// ([`Config::pytorch_native`]).
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "labs" => Ok(Config::labs()),
            "pytorch" => Ok(Config::pytorch_native()),
            _ => Err(bad(format!(
                "preset: unknown preset {} (known: labs, pytorch)",
                quote(name)
            ))),
        }
    }

    /// Parses `key:value,key:value` on top of the defaults. Keys are PyTorch's, plus the
    /// labs' own; `preset:NAME` starts from a named configuration instead of the
    /// defaults, wherever it stands in the list, and the other keys apply on top of it.
    pub fn parse(text: &str) -> Result<Self> {
        let items: Vec<&str> = split_items(text)?
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        let mut presets = items
            .iter()
            .filter_map(|item| item.split_once(':'))
            .filter(|(key, _)| key.trim() == "preset")
            .map(|(_, value)| value.trim());
        let mut c = match (presets.next(), presets.next()) {
            (None, _) => Config::default(),
            (Some(name), None) => Config::preset(name)?,
            (Some(a), Some(b)) => {
                return Err(bad(format!(
                    "preset: two presets, {} and {}; name one",
                    quote(a),
                    quote(b)
                )))
            }
        };
        let mut recycle_given = false;
        // The caching knobs given, for the refusals of `backend:cudaMallocAsync`.
        let mut caching_keys: Vec<String> = Vec::new();
        for item in items {
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| bad(format!("{} is not `key:value`", quote(item))))?;
            let (key, value) = (key.trim(), value.trim());
            let off = matches!(value, "False" | "false" | "0");
            let asks_nothing = off && matches!(key, "expandable_segments" | "recycle_idle_pages");
            if CACHING_KEYS.contains(&key) && !asks_nothing {
                caching_keys.push(format!("{key}:{value}"));
            }
            match key {
                "preset" => {}
                "max_split_size_mb" => {
                    let mb: u64 = value
                        .parse()
                        .map_err(|_| bad(format!("max_split_size_mb: {} is not a whole number of MiB", quote(value))))?;
                    // Smaller values would forbid splitting the 20 MiB segments that serve
                    // the 1-10 MiB requests, as in PyTorch.
                    if mb <= 20 {
                        return Err(bad(format!("max_split_size_mb: {mb} is too small, it must be > 20")));
                    }
                    // Checked: a wrapped product would slip under the minimum above.
                    let bytes = mb.checked_mul(MIB).ok_or_else(|| {
                        bad(format!("max_split_size_mb: {mb} is too large (at most {})", u64::MAX / MIB))
                    })?;
                    c.max_split_size = Some(bytes);
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value
                        .parse()
                        .map_err(|_| bad(format!("garbage_collection_threshold: {} is not a number", quote(value))))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(format!(
                            "garbage_collection_threshold: {t} must be between 0.0 and 1.0, exclusive"
                        )));
                    }
                    c.garbage_collection_threshold = Some(t);
                }
                "roundup_power2_divisions" => {
                    c.roundup_power2_divisions = Divisions::parse(value)
                        .map_err(|m| bad(format!("roundup_power2_divisions: {m}")))?;
                }
                "expandable_segments" => {
                    c.expandable_segments = match value {
                        "True" | "true" | "1" => true,
                        "False" | "false" | "0" => false,
                        _ => return Err(bad(format!("expandable_segments: {} is not True or False", quote(value)))),
                    }
                }
                "recycle_idle_pages" => {
                    recycle_given = true;
                    c.recycle_idle_pages = match value {
                        "True" | "true" | "1" => true,
                        "False" | "false" | "0" => false,
                        _ => return Err(bad(format!("recycle_idle_pages: {} is not True or False", quote(value)))),
                    }
                }
                "max_mapping_mb" => {
                    let mb: u64 = value
                        .parse()
                        .map_err(|_| bad(format!("max_mapping_mb: {} is not a whole number of MiB", quote(value))))?;
                    if mb == 0 {
                        return Err(bad("max_mapping_mb: 0 maps nothing, it must be at least 1".to_string()));
                    }
                    c.max_mapping = mb.checked_mul(MIB).ok_or_else(|| {
                        bad(format!("max_mapping_mb: {mb} is too large (at most {})", u64::MAX / MIB))
                    })?;
                }
                "per_process_memory_fraction" => {
                    let f: f64 = value
                        .parse()
                        .map_err(|_| bad(format!("per_process_memory_fraction: {} is not a number", quote(value))))?;
                    if !(f > 0.0 && f <= 1.0) {
                        return Err(bad(format!("per_process_memory_fraction: {f} must be in (0, 1]")));
                    }
                    c.per_process_memory_fraction = f;
                }
                "park_freed_blocks" => {
                    c.park_freed_blocks = match value {
                        "True" | "true" | "1" => true,
                        "False" | "false" | "0" => false,
                        _ => return Err(bad(format!("park_freed_blocks: {} is not True or False", quote(value)))),
                    }
                }
                "oom_snapshot" => {
                    if value.is_empty() {
                        return Err(bad("oom_snapshot: the path is empty".to_string()));
                    }
                    c.oom_snapshot = Some(value.to_string());
                }
                "backend" => {
                    c.backend = match value {
                        "native" => AllocBackend::Native,
                        "cudaMallocAsync" => AllocBackend::CudaMallocAsync,
                        _ => return Err(bad(format!(
                            "backend: unknown backend {} (known: native, cudaMallocAsync)",
                            quote(value)
                        ))),
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "unknown option {} (known: max_split_size_mb, garbage_collection_threshold, \
                         roundup_power2_divisions, expandable_segments, recycle_idle_pages, max_mapping_mb, per_process_memory_fraction, \
                         park_freed_blocks, oom_snapshot, backend:native|cudaMallocAsync, preset)",
                        quote(key)
                    )))
                }
            }
        }
        if c.backend == AllocBackend::CudaMallocAsync {
            // The driver's pool has no blocks to split, segments to expand or cache to
            // collect: a caching knob would silently mean nothing (PyTorch warns and
            // ignores three of them; here each is an error).
            if c.expandable_segments && !caching_keys.iter().any(|k| k.starts_with("expandable")) {
                caching_keys.push("preset:labs (expandable segments)".to_string());
            }
            if let Some(key) = caching_keys.first() {
                return Err(bad(format!(
                    "{key} conflicts with backend:cudaMallocAsync: the driver's stream-ordered \
                     pool has no blocks, segments or cache of the labs' for it to act on"
                )));
            }
        }
        if !c.expandable_segments {
            // Fixed segments have no pages to move: a preset's recycling lapses with
            // them, an explicit request for it is a mistake.
            if recycle_given && c.recycle_idle_pages {
                return Err(bad(
                    "recycle_idle_pages:True needs expandable_segments:True (fixed segments have no pages to move)"
                        .to_string(),
                ));
            }
            c.recycle_idle_pages = false;
        }
        Ok(c)
    }

    /// The configuration in the syntax `parse` reads.
    pub fn to_conf_string(&self) -> String {
        let mut parts = self.pytorch_parts();
        if self.recycle_idle_pages {
            parts.insert(1, "recycle_idle_pages:True".to_string());
        }
        if self.max_mapping != DEFAULT_MAX_MAPPING {
            parts.insert(1, format!("max_mapping_mb:{}", self.max_mapping / MIB));
        }
        if !self.park_freed_blocks {
            parts.push("park_freed_blocks:False".to_string());
        }
        if let Some(path) = &self.oom_snapshot {
            parts.push(format!("oom_snapshot:{path}"));
        }
        parts.join(",")
    }

    /// The part of the configuration PyTorch knows, in `PYTORCH_CUDA_ALLOC_CONF`'s
    /// syntax (the labs' own knobs left out): what a twin run in PyTorch is given.
    pub fn to_pytorch_conf_string(&self) -> String {
        self.pytorch_parts().join(",")
    }

    fn pytorch_parts(&self) -> Vec<String> {
        if self.backend == AllocBackend::CudaMallocAsync {
            let mut parts = vec!["backend:cudaMallocAsync".to_string()];
            if self.per_process_memory_fraction < 1.0 {
                parts.push(format!(
                    "per_process_memory_fraction:{}",
                    self.per_process_memory_fraction
                ));
            }
            return parts;
        }
        let mut parts = vec![format!(
            "expandable_segments:{}",
            if self.expandable_segments {
                "True"
            } else {
                "False"
            }
        )];
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        if !self.roundup_power2_divisions.is_off() {
            parts.push(format!(
                "roundup_power2_divisions:{}",
                self.roundup_power2_divisions
            ));
        }
        if self.per_process_memory_fraction < 1.0 {
            parts.push(format!(
                "per_process_memory_fraction:{}",
                self.per_process_memory_fraction
            ));
        }
        parts
    }
}

/// The keys that tune the caching allocator, refused with `backend:cudaMallocAsync`
/// (`expandable_segments:False` excepted: it asks for nothing).
const CACHING_KEYS: [&str; 7] = [
    "max_split_size_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "recycle_idle_pages",
    "max_mapping_mb",
    "park_freed_blocks",
];

fn bad(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// The items of `key:value,key:value`, where a value may be a bracketed list with
/// commas of its own (`roundup_power2_divisions:[256:1,512:2,>:8]`).
fn split_items(text: &str) -> Result<Vec<&str>> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, ch) in text.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err(bad(format!("`]` without `[` in {}", quote(text))));
        }
    }
    if depth != 0 {
        return Err(bad(format!("`[` without `]` in {}", quote(text))));
    }
    items.push(text[start..].trim());
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pytorch_syntax() {
        let c = Config::parse(
            "max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.6",
        )
        .unwrap();
        assert_eq!(c.max_split_size, Some(128 * MIB));
        assert!(c.expandable_segments);
        assert_eq!(c.garbage_collection_threshold, Some(0.6));
        assert_eq!(Config::parse("").unwrap(), Config::default());
        assert_eq!(Config::parse(&c.to_conf_string()).unwrap(), c);
        // PyTorch's list form: each interval's divisions, the first covering smaller
        // sizes too, `>` the rest.
        let c = Config::parse(
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],expandable_segments:False",
        )
        .unwrap();
        let d = c.roundup_power2_divisions;
        assert_eq!(d.for_size(1000), 0);
        assert_eq!(d.for_size(300 << 20), 0);
        assert_eq!((d.for_size(512 << 20), d.for_size(1000 << 20)), (2, 2));
        assert_eq!((d.for_size(1 << 30), d.for_size(2000 << 20)), (4, 4));
        assert_eq!((d.for_size(2 << 30), d.for_size(1 << 40)), (8, 8));
        assert_eq!(d.to_string(), "[256:0,512:2,1024:4,>:8]");
        assert_eq!(Config::parse(&c.to_conf_string()).unwrap(), c);
        assert_eq!(
            Config::parse("roundup_power2_divisions:4")
                .unwrap()
                .roundup_power2_divisions
                .for_size(5 << 30),
            4
        );
        let skipped = Config::parse("roundup_power2_divisions:[256:2,1024:4]").unwrap();
        let d = skipped.roundup_power2_divisions;
        let sizes = [300 << 20, 600 << 20, 1 << 30, 4 << 30];
        assert_eq!(sizes.map(|s| d.for_size(s)), [2, 0, 4, 0]);
        assert_eq!(Config::parse(&skipped.to_conf_string()).unwrap(), skipped);
        let c = Config::parse("park_freed_blocks:False").unwrap();
        assert!(!c.park_freed_blocks);
        assert_eq!(Config::parse(&c.to_conf_string()).unwrap(), c);
        let c = Config::parse("max_mapping_mb:64").unwrap();
        assert_eq!(c.max_mapping, 64 * MIB);
        assert_eq!(Config::default().max_mapping, DEFAULT_MAX_MAPPING);
        assert_eq!(Config::parse(&c.to_conf_string()).unwrap(), c);
    }

    #[test]
    fn pytorch_is_given_only_the_keys_it_knows() {
        let c = Config::parse(
            "expandable_segments:True,recycle_idle_pages:True,max_mapping_mb:64,park_freed_blocks:False,\
             oom_snapshot:/tmp/x.json,per_process_memory_fraction:0.5",
        )
        .unwrap();
        assert_eq!(
            c.to_pytorch_conf_string(),
            "expandable_segments:True,per_process_memory_fraction:0.5"
        );
        assert!(c.to_conf_string().contains("max_mapping_mb:64"));
        assert_eq!(
            Config::pytorch_native().to_pytorch_conf_string(),
            "expandable_segments:False"
        );
    }

    #[test]
    fn presets_start_from_a_named_configuration_and_the_keys_apply_on_top() {
        assert_eq!(Config::parse("preset:labs").unwrap(), Config::labs());
        assert_eq!(
            Config::parse("preset:pytorch").unwrap(),
            Config::pytorch_native()
        );
        assert!(!Config::parse("preset:pytorch").unwrap().expandable_segments);
        // Wherever the preset stands, the other keys win over it.
        for text in [
            "preset:pytorch,max_split_size_mb:128,expandable_segments:True",
            "max_split_size_mb:128,expandable_segments:True,preset:pytorch",
        ] {
            let c = Config::parse(text).unwrap();
            assert!(c.expandable_segments, "{text}");
            assert_eq!(c.max_split_size, Some(128 * MIB), "{text}");
        }
        // The preset's page recycling lapses with its expandable segments.
        let c = Config::parse("preset:labs,expandable_segments:False").unwrap();
        assert!(!c.recycle_idle_pages);
        assert_eq!(c, Config::pytorch_native());
        let c = Config::parse("expandable_segments:True,recycle_idle_pages:True").unwrap();
        assert_eq!(c, Config::labs());
        assert_eq!(Config::parse(&c.to_conf_string()).unwrap(), c);
        let e = Config::parse("recycle_idle_pages:True")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs expandable_segments:True"), "{e}");
        let e = Config::parse("preset:torch").unwrap_err().to_string();
        assert!(
            e.contains("unknown preset `torch`") && e.contains("labs, pytorch"),
            "{e}"
        );
        let e = Config::parse("preset:labs,preset:pytorch")
            .unwrap_err()
            .to_string();
        assert!(e.contains("two presets"), "{e}");
    }

    #[test]
    fn the_defaults_are_pytorchs_and_headers_say_which_policy_runs() {
        let d = Config::default();
        assert!(!d.expandable_segments && !d.recycle_idle_pages);
        assert_eq!(d, Config::pytorch_native());
        assert_eq!(Config::parse("").unwrap(), d);
        assert_eq!(d.to_conf_string(), "expandable_segments:False");
        assert_eq!(d.describe(), "allocator: PyTorch's defaults");
        assert_eq!(Config::labs().describe(), "allocator: preset labs");
        assert_eq!(
            Config::labs().to_pytorch_conf_string(),
            "expandable_segments:True"
        );
        // PyTorch's expandable segments, without the labs' recycling, are neither preset.
        let c = Config::parse("expandable_segments:True").unwrap();
        assert!(c.expandable_segments && !c.recycle_idle_pages);
        assert_eq!(c.preset_name(), None);
        assert_eq!(c.describe(), "allocator: expandable_segments:True");
        let c = Config::parse("preset:labs,max_split_size_mb:128").unwrap();
        assert_eq!(
            c.describe(),
            "allocator: expandable_segments:True,recycle_idle_pages:True,max_split_size_mb:128"
        );
    }

    #[test]
    fn bad_keys_and_values_are_clear_errors() {
        for (text, needle) in [
            ("max_split_mb:128", "unknown option `max_split_mb`"),
            ("max_split_size_mb:abc", "not a whole number"),
            ("max_split_size_mb:10", "too small"),
            ("garbage_collection_threshold:1.5", "between 0.0 and 1.0"),
            ("expandable_segments:yes", "not True or False"),
            ("roundup_power2_divisions:3", "power of two"),
            (
                "roundup_power2_divisions:[256:1,4:2]",
                "intervals must increase",
            ),
            ("roundup_power2_divisions:[300:2]", "must be a power of two"),
            ("roundup_power2_divisions:[256:1", "`[` without `]`"),
            ("expandable_segments", "not `key:value`"),
            ("max_mapping_mb:0", "must be at least 1"),
            ("recycle_idle_pages:maybe", "not True or False"),
            ("max_mapping_mb:16.5", "not a whole number"),
            ("max_mapping_mb:99999999999999999", "too large"),
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
