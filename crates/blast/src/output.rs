//! Where a command's output goes, and how it gets there without damage.
//!
//! Outputs are written to a temporary file beside them and renamed into place once
//! complete, so that a reader never sees half an output and a failure leaves the old
//! one. That is right for a regular file and wrong for anything else: renamed onto
//! `/dev/null` or `/dev/stdout`, the temporary file *replaced the device* (as root,
//! which containers often are: `--out /dev/null` turned `/dev/null` into a regular
//! file for every program on the machine). And renamed onto a symbolic link, it
//! replaced the link instead of writing where the link points.
//!
//! [`Destination::of`] tells them apart: `-` is standard output; a device, a FIFO or
//! a socket (directly or through links) is a stream, into which the finished output is
//! copied; anything else is a file, renamed onto the file a link points to.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Where an output goes (see the module's docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A regular file, or a name to create: written beside it, then renamed onto this
    /// path (a link's target, so that the link stays).
    File(PathBuf),
    /// Standard output (`None`, given as `-`), or an existing device, FIFO or socket:
    /// the finished output is copied into it.
    Stream(Option<PathBuf>),
}

impl Destination {
    /// Where `out` sends what is written to it.
    pub fn of(out: &Path) -> Destination {
        if out.as_os_str() == "-" {
            return Destination::Stream(None);
        }
        match std::fs::metadata(out) {
            Ok(m) if !m.is_file() && !m.is_dir() => return Destination::Stream(Some(out.to_path_buf())),
            _ => {}
        }
        // A link (also one whose target does not exist yet): the file it points to.
        let mut path = out.to_path_buf();
        for _ in 0..40 {
            // Fails for anything but a link.
            let Ok(target) = std::fs::read_link(&path) else { break };
            path = match path.parent() {
                Some(dir) if target.is_relative() => dir.join(target),
                _ => target,
            };
        }
        Destination::File(path)
    }

    /// The file to write beside and rename onto, if this is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Destination::File(p) => Some(p),
            Destination::Stream(_) => None,
        }
    }

    /// Puts the complete output `finished` (a temporary file) in place: renamed onto
    /// the file, or copied into the stream and removed. A stream whose reader has gone
    /// (`| head`) is not an error: the reader chose to stop.
    pub fn put(&self, finished: &Path) -> std::io::Result<()> {
        match self {
            Destination::File(p) => std::fs::rename(finished, p),
            Destination::Stream(to) => {
                let copied = std::fs::File::open(finished).and_then(|mut from| match to {
                    None => copy_quietly(&mut from, &mut std::io::stdout().lock()),
                    Some(p) => copy_quietly(&mut from, &mut std::fs::OpenOptions::new().write(true).open(p)?),
                });
                let _ = std::fs::remove_file(finished);
                copied
            }
        }
    }

    /// Writes `data` as the whole output: through a temporary file beside a file, or
    /// straight into a stream.
    pub fn write(&self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Destination::File(p) => {
                let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
                let tmp = dir.join(format!(".{}.gepsea-tmp{}", p.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
                std::fs::write(&tmp, data)?;
                std::fs::rename(&tmp, p).inspect_err(|_| {
                    let _ = std::fs::remove_file(&tmp);
                })
            }
            Destination::Stream(None) => ignore_gone_reader(std::io::stdout().lock().write_all(data)),
            Destination::Stream(Some(p)) => std::fs::OpenOptions::new().write(true).open(p)?.write_all(data),
        }
    }
}

fn copy_quietly(from: &mut std::fs::File, to: &mut impl Write) -> std::io::Result<()> {
    ignore_gone_reader(std::io::copy(from, to).and_then(|_| to.flush()))
}

fn ignore_gone_reader(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_links_and_files_are_told_apart_and_a_device_is_never_replaced() {
        let d = crate::test_dir::TestDir::new("destination");
        let dir = d.path();
        assert_eq!(Destination::of(Path::new("-")), Destination::Stream(None));
        assert_eq!(Destination::of(Path::new("/dev/null")), Destination::Stream(Some("/dev/null".into())));
        let file = dir.join("out.txt");
        assert_eq!(Destination::of(&file), Destination::File(file.clone()), "a name to create");
        std::fs::write(&file, b"old").unwrap();
        assert_eq!(Destination::of(&file), Destination::File(file.clone()));
        // Links, relative and chained, and one whose target is still to be made.
        std::os::unix::fs::symlink("out.txt", dir.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.join("link"), dir.join("link2")).unwrap();
        assert_eq!(Destination::of(&dir.join("link2")), Destination::File(dir.join("out.txt")));
        std::os::unix::fs::symlink("later.txt", dir.join("dangling")).unwrap();
        assert_eq!(Destination::of(&dir.join("dangling")), Destination::File(dir.join("later.txt")));
        // Written through the link: the link stays, the file it points to changes.
        Destination::of(&dir.join("link2")).write(b"new").unwrap();
        assert!(std::fs::symlink_metadata(dir.join("link2")).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        // A device (a null device of the test's own, as root, so that a regression
        // replaces that one and not /dev/null): copied into, still a device afterwards,
        // the temporary file gone.
        let null = dir.join("null");
        let dev = rustix::fs::makedev(1, 3);
        rustix::fs::mknodat(rustix::fs::CWD, &null, rustix::fs::FileType::CharacterDevice, rustix::fs::Mode::from_raw_mode(0o600), dev)
            .unwrap();
        assert_eq!(Destination::of(&null), Destination::Stream(Some(null.clone())));
        let fin = dir.join("finished");
        std::fs::write(&fin, b"output").unwrap();
        Destination::of(&null).put(&fin).unwrap();
        assert!(!fin.exists());
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(&null).unwrap().file_type().is_char_device());
        // A FIFO: its reader gets the bytes.
        let fifo = dir.join("fifo");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, rustix::fs::Mode::from_raw_mode(0o600), 0).unwrap();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        std::fs::write(&fin, b"through the fifo").unwrap();
        Destination::of(&fifo).put(&fin).unwrap();
        assert_eq!(reader.join().unwrap(), b"through the fifo");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        let mut names: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["dangling", "fifo", "link", "link2", "null", "out.txt"], "no temporary file left");
    }
}
