//! `LABS_ALLOC_CONF`: the allocator's knobs, in PyTorch's `PYTORCH_CUDA_ALLOC_CONF`
//! syntax (`key:value,key:value`), so that a PyTorch user's setting means the same here.

use crate::error::{Error, Result};

/// Environment variable holding the configuration of every device's allocator.
pub const ENV_ALLOC_CONF: &str = "LABS_ALLOC_CONF";

const MIB: u64 = 1 << 20;

// ANCHOR: config
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Free blocks at least this large are never split for smaller requests (raw
    /// segments only: a free range of an expandable segment costs nothing, so carving
    /// it up cannot strand memory). `None`: no limit.
    pub max_split_size: Option<u64>,
    /// When reserved memory passes this fraction of the limit, cached segments are
    /// released before new memory is taken from the driver.
    pub garbage_collection_threshold: Option<f64>,
    /// Round requests above 512 B up to one of this many steps between powers of two
    /// (0: plain 512-byte rounding).
    pub roundup_power2_divisions: u32,
    /// Segments are virtual ranges whose pages are mapped on demand and remapped to
    /// where they are needed, instead of fixed `cuMemAlloc` blocks.
    pub expandable_segments: bool,
    /// The share of the device's memory this process may reserve.
    pub per_process_memory_fraction: f64,
    /// Freed blocks are kept whole for the next request of their size (the labs' own
    /// knob, `park_freed_blocks:False` to compare; see `parked.rs`).
    pub park_freed_blocks: bool,
}
// ANCHOR_END: config

// ANCHOR: config_default
impl Default for Config {
    /// Chosen by replaying the real traces in `shared/traces`: expandable segments whose
    /// idle memory moves to wherever memory is needed (only when reserved memory would
    /// otherwise pass its high-water mark) keep peak reserved within about 2% of peak
    /// requested, where fixed segments strand 10-50% (`lab-02` prints the comparison,
    /// with the driver calls and synchronisations each trace cost).
    fn default() -> Self {
        Config {
            max_split_size: None,
            garbage_collection_threshold: None,
            roundup_power2_divisions: 0,
            expandable_segments: true,
            per_process_memory_fraction: 1.0,
            park_freed_blocks: true,
        }
    }
}
// ANCHOR_END: config_default

impl Config {
    /// PyTorch's defaults: fixed segments, no knobs.
    pub fn pytorch_native() -> Self {
        Config {
            expandable_segments: false,
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

    /// Parses `key:value,key:value` on top of the defaults. Keys are PyTorch's.
    pub fn parse(text: &str) -> Result<Self> {
        let mut c = Config::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| bad(format!("`{item}` is not `key:value`")))?;
            let (key, value) = (key.trim(), value.trim());
            match key {
                "max_split_size_mb" => {
                    let mb: u64 = value
                        .parse()
                        .map_err(|_| bad(format!("max_split_size_mb: `{value}` is not a whole number of MiB")))?;
                    // Smaller values would forbid splitting the 20 MiB segments that serve
                    // the 1-10 MiB requests, as in PyTorch.
                    if mb <= 20 {
                        return Err(bad(format!("max_split_size_mb: {mb} is too small, it must be > 20")));
                    }
                    c.max_split_size = Some(mb * MIB);
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value
                        .parse()
                        .map_err(|_| bad(format!("garbage_collection_threshold: `{value}` is not a number")))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(format!(
                            "garbage_collection_threshold: {t} must be between 0.0 and 1.0, exclusive"
                        )));
                    }
                    c.garbage_collection_threshold = Some(t);
                }
                "roundup_power2_divisions" => {
                    let d: u32 = value.parse().map_err(|_| {
                        bad(format!(
                            "roundup_power2_divisions: `{value}` is not a whole number (the per-size list form is not supported)"
                        ))
                    })?;
                    if d != 0 && !d.is_power_of_two() {
                        return Err(bad(format!("roundup_power2_divisions: {d} must be a power of two")));
                    }
                    c.roundup_power2_divisions = if d == 1 { 0 } else { d };
                }
                "expandable_segments" => {
                    c.expandable_segments = match value {
                        "True" | "true" | "1" => true,
                        "False" | "false" | "0" => false,
                        _ => return Err(bad(format!("expandable_segments: `{value}` is not True or False"))),
                    }
                }
                "per_process_memory_fraction" => {
                    let f: f64 = value
                        .parse()
                        .map_err(|_| bad(format!("per_process_memory_fraction: `{value}` is not a number")))?;
                    if !(f > 0.0 && f <= 1.0) {
                        return Err(bad(format!("per_process_memory_fraction: {f} must be in (0, 1]")));
                    }
                    c.per_process_memory_fraction = f;
                }
                "park_freed_blocks" => {
                    c.park_freed_blocks = match value {
                        "True" | "true" | "1" => true,
                        "False" | "false" | "0" => false,
                        _ => return Err(bad(format!("park_freed_blocks: `{value}` is not True or False"))),
                    }
                }
                "backend" if value == "native" => {}
                _ => {
                    return Err(bad(format!(
                        "unknown option `{key}` (known: max_split_size_mb, garbage_collection_threshold, \
                         roundup_power2_divisions, expandable_segments, per_process_memory_fraction, park_freed_blocks, \
                         backend:native)"
                    )))
                }
            }
        }
        Ok(c)
    }

    /// The configuration in the syntax `parse` reads.
    pub fn to_conf_string(&self) -> String {
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
        if self.roundup_power2_divisions > 0 {
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
        if !self.park_freed_blocks {
            parts.push("park_freed_blocks:False".to_string());
        }
        parts.join(",")
    }
}

fn bad(message: String) -> Error {
    Error::InvalidArgument(message)
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
        let c = Config::parse("park_freed_blocks:False").unwrap();
        assert!(!c.park_freed_blocks);
        assert_eq!(Config::parse(&c.to_conf_string()).unwrap(), c);
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
            ("expandable_segments", "not `key:value`"),
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
