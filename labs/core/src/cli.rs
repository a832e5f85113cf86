//! What every lab binary shares on its command line.

use std::fmt::Display;
use std::process::ExitCode;

/// Ends a lab's `main`: prints an error as one readable message (with its causes, for
/// error types that chain them under `{:#}`) instead of a debug dump, and sets the exit
/// status.
pub fn exit<E: Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Lets a lab end quietly when the reader of its output goes away (`lab-02 | head -1`):
/// the conventional death by SIGPIPE (status 141 in a shell), as every Unix tool does,
/// instead of Rust's default of ignoring the signal and panicking in `println!`. Call
/// it first in `main`.
pub fn quiet_broken_pipe() {
    #[cfg(unix)]
    {
        extern "C" {
            fn signal(signum: i32, handler: usize) -> usize;
        }
        // The same numbers on Linux and macOS.
        const SIGPIPE: i32 = 13;
        const SIG_DFL: usize = 0;
        // SAFETY: restores the default disposition of one signal before any thread is
        // started; no handler code is installed.
        unsafe {
            signal(SIGPIPE, SIG_DFL);
        }
    }
}

/// The device a lab runs on: its `--device` flag, else `LABS_DEVICE`, else the first GPU,
/// else the simulated GPU. A fallback is announced on stderr, so that a reader without a
/// GPU knows which device the figures come from.
// ANCHOR: open_device
pub fn open_device(flag: Option<&str>) -> crate::Result<crate::Device> {
    let selection = crate::select_device(flag)?;
    if let Some(notice) = &selection.notice {
        eprintln!("{notice}");
    }
    Ok(selection.device)
}
// ANCHOR_END: open_device

/// The `--device` and `--conf` flags every lab takes: `#[command(flatten)]` them into a
/// lab's arguments.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceFlag {
    /// Device to run on: cuda, cuda:N, sim, dry (the simulated GPU's allocations without
    /// kernels or values) or cpu (default: LABS_DEVICE, else the first GPU, else the
    /// simulated GPU).
    #[arg(long = "device", value_name = "DEVICE", global = true)]
    pub name: Option<String>,
    /// The allocator's configuration, in PYTORCH_CUDA_ALLOC_CONF's syntax: PyTorch's keys
    /// with PyTorch's meaning, the labs' own, and `preset:labs` for the labs' policy
    /// (default: LABS_ALLOC_CONF, else PyTorch's defaults).
    #[arg(long = "conf", value_name = "CONF", global = true)]
    pub conf: Option<String>,
}

impl DeviceFlag {
    /// The device the flag chooses, through [`open_device`], after [`apply_conf`](Self::apply_conf).
    pub fn open(&self) -> crate::Result<crate::Device> {
        self.apply_conf()?;
        open_device(self.name.as_deref())
    }

    /// The allocator configuration in force: `--conf`, else `LABS_ALLOC_CONF`, else
    /// PyTorch's defaults. A bad one is a one-line error naming its source.
    pub fn config(&self) -> crate::Result<crate::alloc::Config> {
        match &self.conf {
            Some(text) => crate::alloc::Config::parse(text).map_err(|e| match e {
                crate::Error::InvalidArgument(m) => {
                    crate::Error::InvalidArgument(format!("--conf: {m}"))
                }
                e => e,
            }),
            None => crate::alloc::Config::from_env(),
        }
    }

    /// Checks `--conf` and makes it this process's `LABS_ALLOC_CONF`, so that every
    /// device's allocator, and every process the lab starts (ranks), takes it. Called
    /// before the first allocation, as `PYTORCH_CUDA_ALLOC_CONF` is read before CUDA's.
    pub fn apply_conf(&self) -> crate::Result<()> {
        let config = self.config()?;
        if self.conf.is_some() {
            std::env::set_var(crate::alloc::ENV_ALLOC_CONF, config.to_conf_string());
        }
        Ok(())
    }
}

/// What a command writes at a path: a file, or a folder it creates if needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    File,
    Folder,
}

/// A path a command reads or writes, with the flag that names it.
#[derive(Debug, Clone, Copy)]
pub struct PathArg<'a> {
    /// The flag (`--snapshot`), or the argument's name (`FILE`).
    pub flag: &'a str,
    pub path: &'a std::path::Path,
}

impl<'a> PathArg<'a> {
    pub fn new(flag: &'a str, path: &'a std::path::Path) -> PathArg<'a> {
        PathArg { flag, path }
    }
}

/// Checks a command's outputs before it starts work, so that a bad path fails at once
/// rather than after the run, and no output destroys an input or another output:
/// a file's folder exists and is a folder and the file is not a folder; a folder to
/// create is a folder where it exists and its nearest existing ancestor is a folder;
/// no path is given twice, and no output is one of `inputs`. Two paths are the same
/// when they name the same file: compared canonicalized where they exist, else by the
/// canonical folder and the name, else as absolute paths. The error is one line that
/// names the flag.
pub fn check_outputs(
    outputs: &[(PathArg<'_>, Written)],
    inputs: &[PathArg<'_>],
) -> crate::Result<()> {
    use std::path::Path;
    let bad = |a: &PathArg<'_>, why: String| {
        crate::Error::InvalidArgument(format!("{} {}: {why}", a.flag, a.path.display()))
    };
    for (a, written) in outputs {
        if a.path.as_os_str().is_empty() {
            return Err(bad(a, "an empty path".into()));
        }
        match written {
            Written::File => {
                if a.path.is_dir() {
                    return Err(bad(a, "is a folder, not a file to write".into()));
                }
                let folder = match a.path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                if !folder.exists() {
                    return Err(bad(
                        a,
                        format!("the folder {} does not exist", folder.display()),
                    ));
                }
                if !folder.is_dir() {
                    return Err(bad(a, format!("{} is not a folder", folder.display())));
                }
            }
            Written::Folder => {
                let existing = a.path.ancestors().find(|p| p.exists());
                if let Some(p) = existing.filter(|p| !p.is_dir()) {
                    return Err(bad(
                        a,
                        format!("{} exists and is not a folder", p.display()),
                    ));
                }
            }
        }
    }
    let all: Vec<(&PathArg<'_>, bool, std::path::PathBuf)> = outputs
        .iter()
        .map(|(a, _)| (a, true, same_file_key(a.path)))
        .chain(inputs.iter().map(|a| (a, false, same_file_key(a.path))))
        .collect();
    for (i, (a, a_out, ka)) in all.iter().enumerate() {
        for (b, b_out, kb) in &all[i + 1..] {
            if (*a_out || *b_out) && ka == kb {
                let (out, other) = if *a_out { (a, b) } else { (b, a) };
                return Err(bad(
                    out,
                    format!(
                        "the same file as {} {}; give each its own",
                        other.flag,
                        other.path.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// What identifies the file at `path`: its canonical path where it exists, else its
/// canonical folder joined with its name, else its absolute path.
fn same_file_key(path: &std::path::Path) -> std::path::PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    if let (Some(folder), Some(name)) = (path.parent(), path.file_name()) {
        let folder = if folder.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            folder
        };
        if let Ok(f) = folder.canonicalize() {
            return f.join(name);
        }
    }
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The most bytes one quantity sized by a command's flags may take (a model's
/// parameters, a batch's activations): more than any device holds, and far from
/// overflowing the arithmetic that adds such quantities up.
pub const MAX_SIZED_BYTES: u64 = 1 << 50;

/// The bytes of `what`: `each` bytes times the product of the flags' values
/// (`("--batch", 8)`), computed in checked arithmetic before anything of that size is
/// allocated. Where the product overflows or exceeds [`MAX_SIZED_BYTES`], an error of
/// one line naming the flags, their values and the limit.
pub fn sized(what: &str, factors: &[(&str, usize)], each: u64) -> crate::Result<u64> {
    let total = (factors.iter()).try_fold(each, |acc, &(_, v)| acc.checked_mul(v as u64));
    match total {
        Some(b) if b <= MAX_SIZED_BYTES => Ok(b),
        _ => {
            let named: Vec<String> = factors.iter().map(|(f, v)| format!("{f} {v}")).collect();
            Err(crate::Error::InvalidArgument(format!(
                "{}: {what} would exceed {}, the most a command may size (more than any \
                 device holds)",
                named.join(" x "),
                crate::format::bytes(MAX_SIZED_BYTES)
            )))
        }
    }
}

/// The line of a lab's output header that says which allocator policy the device's
/// allocator runs: "allocator: PyTorch's defaults" (unless `LABS_ALLOC_CONF` says
/// otherwise), "allocator: preset labs", or the keys that differ.
// ANCHOR: allocator_line
pub fn allocator_line(device: &crate::Device) -> crate::Result<String> {
    Ok(device.allocator()?.config().describe())
}
// ANCHOR_END: allocator_line

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("labs-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn sized_names_the_flags_of_a_product_that_overflows_or_exceeds_the_limit() {
        assert_eq!(sized("x", &[("--a", 3), ("--b", 5)], 4).unwrap(), 60);
        let e = sized("the table", &[("--a", usize::MAX), ("--b", 2)], 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--a 18446744073709551615 x --b 2: the table"),
            "{e}"
        );
        let over = (MAX_SIZED_BYTES / 4 + 1) as usize;
        assert!(sized("x", &[("--a", over)], 4).is_err());
        assert!(sized("x", &[("--a", over - 1)], 4).is_ok());
    }

    #[test]
    fn outputs_are_checked_against_folders_each_other_and_the_inputs() {
        let dir = scratch("outputs");
        let file = dir.join("a.json");
        std::fs::write(&file, "x").unwrap();
        let file_out = |flag, p| (PathArg::new(flag, p), Written::File);
        let err = |outputs: &[(PathArg<'_>, Written)], inputs: &[PathArg<'_>]| {
            check_outputs(outputs, inputs).unwrap_err().to_string()
        };
        // Fine: a new file in an existing folder, beside an input of another name.
        let new = dir.join("b.json");
        check_outputs(&[file_out("--out", &new)], &[PathArg::new("FILE", &file)]).unwrap();
        // A folder under a file cannot be created.
        let under = file.join("pictures");
        let e = err(
            &[(PathArg::new("--pictures", &under), Written::Folder)],
            &[],
        );
        assert!(
            e.starts_with("--pictures") && e.contains("not a folder"),
            "{e}"
        );
        // The same new file spelled two ways.
        let other = dir.join(".").join("b.json");
        let e = err(
            &[file_out("--timeline", &new), file_out("--snapshot", &other)],
            &[],
        );
        assert!(e.contains("same file"), "{e}");
        // An output onto an input, through `..`.
        let round = dir.join("..").join(dir.file_name().unwrap()).join("a.json");
        let e = err(&[file_out("--out", &round)], &[PathArg::new("FILE", &file)]);
        assert!(e.starts_with("--out") && e.contains("FILE"), "{e}");
        // Two inputs may be the same file.
        check_outputs(&[], &[PathArg::new("A", &file), PathArg::new("B", &file)]).unwrap();
        let e = err(&[file_out("--out", Path::new(""))], &[]);
        assert!(e.contains("empty"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
