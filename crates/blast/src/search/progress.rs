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
        } else if !self.quiet {
            if let Some(line) = self.line(done) {
                note!("{line}");
            }
        }
    }

    /// The line to print (without a terminal) when `done` queries are finished: one
    /// per tenth crossed, saying the share done, not the tenth (results come in
    /// batches: 14 of 100 is 14 %, not 10 %).
    fn line(&mut self, done: usize) -> Option<String> {
        if self.total == 0 {
            return None;
        }
        let decile = done * 10 / self.total;
        if decile <= self.last_decile {
            return None;
        }
        self.last_decile = decile;
        Some(format!("gepsea search: {done}/{} queries ({}%)", self.total, done * 100 / self.total))
    }

    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_per_tenth_crossed_with_the_share_done() {
        let mut p = Progress { bar: None, total: 100, last_decile: 0, quiet: false };
        let lines: Vec<String> = [5, 14, 19, 39, 52, 100].into_iter().filter_map(|d| p.line(d)).collect();
        assert_eq!(
            lines,
            [
                "gepsea search: 14/100 queries (14%)",
                "gepsea search: 39/100 queries (39%)",
                "gepsea search: 52/100 queries (52%)",
                "gepsea search: 100/100 queries (100%)"
            ]
        );
        let mut empty = Progress { bar: None, total: 0, last_decile: 0, quiet: false };
        assert_eq!(empty.line(0), None);
    }
}
