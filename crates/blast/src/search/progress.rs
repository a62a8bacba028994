//! Progress of a search on stderr: a bar on a terminal, a line per tenth otherwise,
//! nothing with `-q`.

use std::io::IsTerminal;

pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
    last_decile: usize,
    quiet: bool,
}

impl Progress {
    pub(crate) fn new(total: usize, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(total as u64);
            b.set_style(indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} queries  {elapsed} elapsed, ETA {eta}").unwrap());
            b
        });
        Progress { bar, total, last_decile: 0, quiet }
    }

    pub(crate) fn set(&mut self, done: usize) {
        if let Some(b) = &self.bar {
            b.set_position(done as u64);
        } else if !self.quiet && self.total > 0 {
            let decile = done * 10 / self.total;
            if decile > self.last_decile {
                self.last_decile = decile;
                eprintln!("gepsea search: {done}/{} queries ({}%)", self.total, decile * 10);
            }
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
