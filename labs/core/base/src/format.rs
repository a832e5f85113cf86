//! Human-readable sizes, durations and rates for the labs' tables.

use std::time::Duration;

/// `1536` -> `1.50 KiB`; binary units, as `nvidia-smi` and PyTorch's summary use.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// A duration with a unit that keeps three significant digits visible.
pub fn duration(d: Duration) -> String {
    let ns = d.as_secs_f64() * 1e9;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Bytes moved over a duration, in decimal GB/s (the unit bandwidth is quoted in).
pub fn gb_per_s(bytes: u64, d: Duration) -> String {
    format!("{:.1} GB/s", bytes as f64 / d.as_secs_f64() / 1e9)
}

/// `text` as an error message may quote it: at most 60 characters, the rest
/// elided, so that a megabyte of input gives a readable line rather than a megabyte.
pub fn quote(text: &str) -> String {
    const QUOTE_MAX: usize = 60;
    // Control characters escaped (`\n`, `\u{0}`): a message stays on one line. The
    // limit is on what is shown, escapes included.
    let (mut shown, mut width) = (String::new(), 0);
    for c in text.chars() {
        if width >= QUOTE_MAX {
            return format!("`{shown}...` ({} bytes)", text.len());
        }
        if c.is_control() {
            let escaped: String = c.escape_default().collect();
            width += escaped.len();
            shown.push_str(&escaped);
        } else {
            width += 1;
            shown.push(c);
        }
    }
    format!("`{shown}`")
}

/// A parser's own message, which may quote the input it choked on (serde_json's does,
/// whole): cut to a line of at most 200 characters.
pub fn quote_message(message: &str) -> String {
    const MESSAGE_MAX: usize = 200;
    let line: String = (message.chars())
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match line.char_indices().nth(MESSAGE_MAX) {
        Some((cut, _)) => format!("{}... ({} bytes)", &line[..cut], message.len()),
        None => line,
    }
}

/// Parses `512`, `64KiB`, `20MiB`, `16GiB`, `1.5GB`, `80G`, `1e9` into bytes, exactly:
/// a size that is not a whole number of bytes, or does not fit 64 bits, is an error
/// rather than a truncated or saturated value.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let hint = || format!("{} is not a size (try 512, 20MiB or 16GiB)", quote(text));
    // The number: digits, an optional fraction, an optional exponent (`1.5e3`).
    let digits_end = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let int_len = digits_end(t);
    let (int_part, rest) = t.split_at(int_len);
    let (frac_part, rest) = match rest.strip_prefix('.') {
        Some(r) => r.split_at(digits_end(r)),
        None => ("", rest),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(hint());
    }
    // An exponent is `e` followed by digits; `e` alone is the unit EiB's first letter.
    let exponent_digits = |r: &str| {
        let sign_len = usize::from(r.starts_with(['+', '-']));
        (sign_len, sign_len + digits_end(&r[sign_len..]))
    };
    let exponent = rest
        .strip_prefix(['e', 'E'])
        .filter(|r| exponent_digits(r).0 < exponent_digits(r).1);
    let (exponent, unit) = match exponent {
        Some(r) => {
            let (_, len) = exponent_digits(r);
            // Beyond any u64 either way; clamped so that the arithmetic stays small.
            let e: i64 = r[..len]
                .parse()
                .unwrap_or(if r.starts_with('-') { -99 } else { 99 });
            (e.clamp(-99, 99), &r[len..])
        }
        None => (0, rest),
    };
    let scale: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "p" | "pib" => 1 << 50,
        "e" | "eib" => 1 << 60,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        other => {
            return Err(format!(
                "{} is not a size unit (units: B, KiB, MiB, GiB, TiB, PiB, EiB, KB, MB, GB, \
                 TB, PB)",
                quote(other)
            ))
        }
    };
    let too_large = || {
        format!(
            "{} is too large: sizes are at most 2^64 - 1 bytes",
            quote(text)
        )
    };
    // value = digits * 10^(exponent - fraction digits) * scale, in exact integers.
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    let power = exponent - frac_part.len() as i64;
    // More than 40 significant digits cannot be a u64 whatever the power (the power is
    // at least -99, and a fraction of a byte is refused below).
    if digits.len() as i64 + power.min(0) > 40 || digits.len() > 200 {
        return Err(too_large());
    }
    let mut mantissa: u128 = 0;
    for d in digits.bytes() {
        mantissa = match mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add((d - b'0') as u128))
        {
            Some(m) => m,
            None => return Err(too_large()),
        };
    }
    let value = if mantissa == 0 {
        0
    } else if power >= 0 {
        10u128
            .checked_pow(power as u32)
            .and_then(|p| mantissa.checked_mul(p))
            .and_then(|m| m.checked_mul(scale))
            .ok_or_else(too_large)?
    } else {
        let divisor = 10u128.checked_pow((-power) as u32).ok_or_else(too_large)?;
        let scaled = mantissa.checked_mul(scale).ok_or_else(too_large)?;
        if scaled % divisor != 0 {
            return Err(format!("{} is not a whole number of bytes", quote(text)));
        }
        scaled / divisor
    };
    u64::try_from(value).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(20 << 20), "20.00 MiB");
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("512").unwrap(), 512);
        assert_eq!(parse_bytes("20MiB").unwrap(), 20 << 20);
        assert_eq!(parse_bytes("16GiB").unwrap(), 16 << 30);
        assert_eq!(parse_bytes("1.5 KiB").unwrap(), 1536);
        assert_eq!(parse_bytes("2GB").unwrap(), 2_000_000_000);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }
}
