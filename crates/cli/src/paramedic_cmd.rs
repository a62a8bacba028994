//! `gepsea paramedic encode|decode`: ParaMEDIC metadata for output files.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use paramedic::blast::{BlastJob, BlastPlugin};
use paramedic::container;
use paramedic::{MetadataPlugin, ZstdPlugin};

#[derive(clap::Subcommand)]
pub enum ParamedicCmd {
    /// Turn an output file into metadata (at the compute site).
    Encode(EncodeArgs),
    /// Regenerate the exact output from metadata (at the storage site).
    Decode(DecodeArgs),
}

#[derive(clap::Args)]
pub struct EncodeArgs {
    /// The output to encode (e.g. a BLAST report written by `gepsea search`).
    #[arg(long)]
    output: PathBuf,
    /// Where to write the metadata.
    #[arg(long)]
    out: PathBuf,
    /// blast: semantic metadata of a BLAST report (needs --db, --query, --outfmt and the
    /// BLAST+ options after `--`); zstd: byte-stream compression of any file.
    #[arg(long, default_value = "blast", value_parser = ["blast", "zstd"])]
    plugin: String,
    /// The gepsea database the report was searched against.
    #[arg(long)]
    db: Option<PathBuf>,
    /// The queries of the search.
    #[arg(long)]
    query: Option<PathBuf>,
    /// The report's -outfmt (0, 5, 6 or 7).
    #[arg(long, default_value = "0")]
    outfmt: String,
    /// The BLAST+ options of the search, after `--`.
    #[arg(last = true, allow_hyphen_values = true)]
    blast_args: Vec<String>,
}

#[derive(clap::Args)]
pub struct DecodeArgs {
    /// The metadata file.
    #[arg(long)]
    metadata: PathBuf,
    /// Where to write the regenerated output.
    #[arg(long)]
    out: PathBuf,
    /// This site's replica of the database (for BLAST metadata).
    #[arg(long)]
    db: Option<PathBuf>,
}

/// Writes `data` to `path` through a temporary file renamed into place.
fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.gepsea-tmp{}", path.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

pub fn run(cmd: &ParamedicCmd) -> Result<()> {
    match cmd {
        ParamedicCmd::Encode(a) => {
            let output = std::fs::read(&a.output).with_context(|| format!("reading {}", a.output.display()))?;
            let plugin: Box<dyn MetadataPlugin> = match a.plugin.as_str() {
                "zstd" => Box::new(ZstdPlugin::default()),
                _ => {
                    let (Some(db), Some(query)) = (&a.db, &a.query) else { bail!("the blast plug-in needs --db (the database searched) and --query (its queries)") };
                    Box::new(BlastPlugin::compute_site(BlastJob { db_dir: db.clone(), query: query.clone(), outfmt: a.outfmt.clone(), blast_args: a.blast_args.clone() }))
                }
            };
            let sealed = container::seal(plugin.as_ref(), &output).with_context(|| format!("encoding {}", a.output.display()))?;
            write_atomically(&a.out, &sealed)?;
            eprintln!("gepsea paramedic: {} bytes of output -> {} bytes of {} metadata ({:.1}x smaller), {}", output.len(), sealed.len(), plugin.name(), output.len() as f64 / sealed.len().max(1) as f64, a.out.display());
            Ok(())
        }
        ParamedicCmd::Decode(a) => {
            let data = std::fs::read(&a.metadata).with_context(|| format!("reading {}", a.metadata.display()))?;
            let (name, _) = container::unwrap(&data).with_context(|| format!("{}", a.metadata.display()))?;
            let output = match name.as_str() {
                "zstd" => container::open(&ZstdPlugin::default(), &data),
                "blast" => {
                    let Some(db) = &a.db else { bail!("{}: BLAST metadata: give --db, this site's replica of the database", a.metadata.display()) };
                    let p = BlastPlugin::storage_site(db);
                    let out = container::open(&p, &data);
                    if p.last_runs() > 1 {
                        eprintln!("gepsea paramedic: the search over all subjects differed (a query overflowed BLAST's preliminary hit list): regenerated per query, {} BLAST+ runs", p.last_runs());
                    }
                    out
                }
                other => bail!("{}: made by plug-in {other:?}, which this build does not have", a.metadata.display()),
            }
            .with_context(|| format!("{}", a.metadata.display()))?;
            write_atomically(&a.out, &output)?;
            eprintln!("gepsea paramedic: regenerated {} bytes from {} bytes of {name} metadata, {}", output.len(), data.len(), a.out.display());
            Ok(())
        }
    }
}
