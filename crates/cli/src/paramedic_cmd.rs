//! `gepsea paramedic encode|decode`: ParaMEDIC metadata for output files.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use paramedic::blast::{BlastJob, BlastPlugin};
use paramedic::trace::TracePlugin;
use paramedic::{container, transfer};
use paramedic::{MetadataPlugin, ZstdPlugin};

use crate::logging::{say, tell};

#[derive(clap::Subcommand)]
pub enum ParamedicCmd {
    /// Turn an output file into metadata (at the compute site).
    Encode(EncodeArgs),
    /// Regenerate the exact output from metadata (at the storage site).
    Decode(DecodeArgs),
    /// The storage site: receive metadata over the network, regenerate, write outputs.
    Serve(ServeArgs),
    /// Send a metadata file to a storage site (`paramedic serve`).
    Send(SendArgs),
    /// Write a new random key for encrypted transfers (give the same file to both sites).
    Keygen(KeygenArgs),
}

#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Where to write the key (created readable by its owner only; never overwritten).
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// This site's replica of the database (for BLAST metadata).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Directory the regenerated outputs are written to.
    #[arg(long)]
    out: PathBuf,
    /// Address to listen on (e.g. 10.0.0.9:7500).
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Stop after this many objects (default: serve until killed).
    #[arg(long)]
    count: Option<usize>,
    /// Accept only transfers encrypted under this key (`paramedic keygen`); without
    /// it, only unencrypted ones.
    #[arg(long)]
    key: Option<PathBuf>,
    /// BLAST+ threads per regeneration (default: this machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Objects (parts) checked and regenerated at once, each on a thread of its own.
    #[arg(long, default_value_t = paramedic::storage::DEFAULT_OBJECTS_AT_ONCE, value_parser = clap::value_parser!(u64).range(1..=256))]
    objects_at_once: u64,
    /// Largest object accepted, in bytes: an object is received whole into memory, so
    /// a larger one is refused before anything is allocated for it.
    #[arg(long, default_value_t = transfer::DEFAULT_MAX_OBJECT)]
    max_object: u64,
}

#[derive(clap::Args)]
pub struct SendArgs {
    /// The metadata file.
    #[arg(long)]
    metadata: PathBuf,
    /// The storage site's address (`paramedic serve --listen`).
    #[arg(long)]
    to: std::net::SocketAddr,
    /// Name of the output at the storage site (default: the metadata file's name
    /// without its extension).
    #[arg(long)]
    name: Option<String>,
    /// This host's address towards the storage site (default: chosen by the route).
    #[arg(long)]
    from: Option<std::net::IpAddr>,
    /// Encrypt under this key (`paramedic keygen`); the storage site must hold it too.
    #[arg(long)]
    key: Option<PathBuf>,
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
    /// BLAST+ options after `--`); trace: a communication trace (`<ns>\t<kind>\t<peer>\t<bytes>`
    /// lines) as its first period plus differences; zstd: byte-stream compression of any file.
    #[arg(long, default_value = "blast", value_parser = ["blast", "trace", "zstd"])]
    plugin: String,
    /// The gepsea database the report was searched against.
    #[arg(long)]
    db: Option<PathBuf>,
    /// The queries of the search.
    #[arg(long)]
    query: Option<PathBuf>,
    /// The report's -outfmt (0 to 7, or 10: CSV whose query and subject come before any title)
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
    /// BLAST+ threads for the regeneration (default: this machine's cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// Writes a file whole or not at all (a temporary file beside it, renamed).
pub(crate) fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    transfer::write_atomically(path, data).with_context(|| format!("writing {}", path.display()))
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Reads a key file given on the command line.
pub fn read_key(path: Option<&Path>) -> Result<Option<transfer::Key>> {
    path.map(|p| transfer::Key::read(p).context("reading the transfer key")).transpose()
}

/// Sends `container` to the storage site at `to` as `name`; prints what happened.
fn send_to_storage(
    to: std::net::SocketAddr,
    from: Option<std::net::IpAddr>,
    name: &str,
    container: &[u8],
    key: Option<&transfer::Key>,
) -> Result<()> {
    let sent = transfer::send_to(to, from, name, None, container, key).with_context(|| format!("sending {name} to {to}"))?;
    say!(
        "gepsea paramedic: {} bytes sent to {to}{} in {:.2} s; the storage site wrote {} ({} bytes, {:.2} s there); {} reconnect(s), {} frame(s) resent",
        container.len(),
        if key.is_some() { " encrypted" } else { "" },
        sent.seconds,
        sent.ack.name,
        sent.ack.result.as_ref().copied().unwrap_or(0),
        sent.ack.seconds,
        sent.reconnects,
        sent.frames_resent
    );
    Ok(())
}

/// `gepsea search --storage-site` in agent mode: every part goes to `storage` as soon as
/// its batch is final, shipped by the agent that wrote it, as `ship` says (`output`,
/// `zstd`, or `metadata` of `search` = database, queries, format, options).
pub fn ship_parts_to(
    storage: std::net::SocketAddr,
    key_file: Option<&Path>,
    ship: &str,
    out: &Path,
    search: (&Path, &[String]),
) -> Result<gepsea_blast::ship::ShipParts> {
    use gepsea_blast::ship::PartEncoding;
    // Check the key now, not after the search; the agents read it again themselves.
    read_key(key_file)?;
    let abs = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("{}", p.display()));
    let name =
        out.file_name().map(|n| n.to_string_lossy().into_owned()).with_context(|| format!("--out {}: not a file name", out.display()))?;
    Ok(gepsea_blast::ship::ShipParts {
        storage,
        key_file: key_file.map(abs).transpose()?,
        encoding: match ship {
            "metadata" => PartEncoding::Metadata,
            "zstd" => PartEncoding::Zstd(paramedic::plugin::ZSTD_LEVEL),
            "auto" => PartEncoding::Auto,
            _ => PartEncoding::Output,
        },
        name,
        db: abs(search.0)?,
        blast_args: search.1.to_vec(),
    })
}

/// `gepsea search --storage-site`: once the output is complete, ship it as `ship` says
/// (`output`, `zstd`, or `metadata`: BLAST metadata of `search` = database, queries,
/// format, options) to `storage`, through the node's agent when there is one.
pub fn deliver_to(
    storage: std::net::SocketAddr,
    key_file: Option<&Path>,
    ship: &str,
    search: (&Path, &Path, &str, &[String]),
) -> Result<gepsea_blast::search::Deliver> {
    // Check the key now, not after the search; the agent reads it again itself.
    read_key(key_file)?;
    let abs = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("{}", p.display()));
    let key_file = key_file.map(abs).transpose()?;
    let encoding = match ship {
        "metadata" => {
            let (db, query, outfmt, args) = search;
            paramedic::agent::Encoding::Blast(BlastJob {
                db_dir: abs(db)?,
                query: abs(query)?,
                outfmt: outfmt.to_string(),
                blast_args: args.to_vec(),
            })
        }
        "zstd" => paramedic::agent::Encoding::Zstd(paramedic::plugin::ZSTD_LEVEL),
        _ => paramedic::agent::Encoding::Output,
    };
    Ok(gepsea_blast::search::Deliver(std::sync::Arc::new(move |out: &Path, agent: Option<&gepsea_client::Client>| {
        let req = paramedic::agent::ShipRequest {
            output: std::fs::canonicalize(out).map_err(|e| format!("{}: {e}", out.display()))?,
            name: out.file_name().unwrap_or_default().to_string_lossy().into_owned(),
            storage,
            key_file: key_file.clone(),
            encoding: encoding.clone(),
        };
        let shipped = match agent {
            Some(c) => paramedic::agent::ship_via(c, &req),
            None => paramedic::agent::ship(&req),
        }
        .map_err(|e| e.to_string())?;
        serde_json::to_value(shipped).map_err(|e| e.to_string())
    })))
}

/// `serve` runs until stopped: on SIGINT or SIGTERM remove what this process keeps
/// (its gepsea-net runtime directory, a half-written output, regeneration scratch) and
/// exit, so a stopped storage site leaves nothing behind.
fn stop_cleanly_on_signal(namespace: String, out: PathBuf) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&namespace));
            paramedic::storage::StorageSite::remove_temporaries(&out, std::process::id());
            say!("gepsea paramedic: storage site stopped by signal {sig}");
            std::process::exit(128 + sig);
        }
    });
    Ok(())
}

/// Refuses an `--out` that names one of the command's inputs (`flag`, path): the
/// result would replace what it was made from.
fn refuse_overwriting(out: &Path, inputs: &[(&str, Option<&PathBuf>)]) -> Result<()> {
    for (flag, input) in inputs {
        if input.is_some_and(|p| gepsea_blast::tools::same_file(out, p)) {
            bail!("--out {} is the {flag} file: writing it would destroy it; choose another path", out.display());
        }
    }
    Ok(())
}

pub fn run(cmd: &ParamedicCmd) -> Result<()> {
    match cmd {
        ParamedicCmd::Serve(a) => {
            std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
            let key = read_key(a.key.as_deref())?;
            let ns = format!("paramedic-storage{}", std::process::id());
            let port = transfer::storage_port(&ns, a.listen).with_context(|| format!("listening on {}", a.listen))?;
            stop_cleanly_on_signal(ns.clone(), a.out.clone())?;
            say!(
                "gepsea paramedic: storage site listening on {}{}, writing to {}",
                a.listen,
                if key.is_some() { " (encrypted transfers only)" } else { "" },
                a.out.display()
            );
            let site = paramedic::storage::StorageSite::new(&a.out, a.db.as_deref(), a.threads.unwrap_or_else(cores));
            let stats = site.stats();
            transfer::serve(&port, &site, a.count, key.as_ref(), a.max_object, a.objects_at_once as usize, |ack| match &ack.result {
                Ok(n) => {
                    let mut s = stats.lock();
                    s.acknowledged(ack);
                    let progress =
                        s.reports_in_progress.get(&ack.name).map(|(have, all)| format!("; {have} of {all} parts in")).unwrap_or_default();
                    say!("gepsea paramedic: regenerated {} ({n} bytes) in {:.2} s{progress}", ack.name, ack.seconds)
                }
                Err(e) => {
                    stats.lock().acknowledged(ack);
                    tell!("gepsea paramedic: refused {}: {e}", ack.name)
                }
            })?;
            drop(site);
            drop(port);
            let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&ns));
            Ok(())
        }
        ParamedicCmd::Send(a) => {
            let data = std::fs::read(&a.metadata).with_context(|| format!("reading {}", a.metadata.display()))?;
            container::unwrap(&data).with_context(|| format!("{}", a.metadata.display()))?;
            let name = match &a.name {
                Some(n) => n.clone(),
                None => a.metadata.file_stem().unwrap_or_default().to_string_lossy().into_owned(),
            };
            send_to_storage(a.to, a.from, &name, &data, read_key(a.key.as_deref())?.as_ref())
        }
        ParamedicCmd::Keygen(a) => {
            transfer::Key::generate().context("reading /dev/urandom")?.write_new(&a.out).context("writing the key")?;
            say!("gepsea paramedic: wrote a new key to {} (give the same file to the storage site's `serve --key` and the compute site's `--key`)", a.out.display());
            Ok(())
        }
        ParamedicCmd::Encode(a) => {
            refuse_overwriting(&a.out, &[("--output", Some(&a.output)), ("--query", a.query.as_ref())])?;
            let output = std::fs::read(&a.output).with_context(|| format!("reading {}", a.output.display()))?;
            let plugin: Box<dyn MetadataPlugin> = match a.plugin.as_str() {
                "zstd" => Box::new(ZstdPlugin::default()),
                "trace" => Box::new(TracePlugin),
                _ => {
                    let (Some(db), Some(query)) = (&a.db, &a.query) else {
                        bail!("the blast plug-in needs --db (the database searched) and --query (its queries)")
                    };
                    Box::new(BlastPlugin::compute_site(BlastJob {
                        db_dir: db.clone(),
                        query: query.clone(),
                        outfmt: a.outfmt.clone(),
                        blast_args: a.blast_args.clone(),
                    }))
                }
            };
            let sealed = container::seal(plugin.as_ref(), &output).with_context(|| format!("encoding {}", a.output.display()))?;
            write_atomically(&a.out, &sealed)?;
            say!(
                "gepsea paramedic: {} bytes of output -> {} bytes of {} metadata ({:.1}x smaller), {}",
                output.len(),
                sealed.len(),
                plugin.name(),
                output.len() as f64 / sealed.len().max(1) as f64,
                a.out.display()
            );
            Ok(())
        }
        ParamedicCmd::Decode(a) => {
            refuse_overwriting(&a.out, &[("--metadata", Some(&a.metadata))])?;
            let data = std::fs::read(&a.metadata).with_context(|| format!("reading {}", a.metadata.display()))?;
            let (name, _) = container::unwrap(&data).with_context(|| format!("{}", a.metadata.display()))?;
            let output = match name.as_str() {
                "blast" => {
                    let Some(db) = &a.db else { bail!("{}: BLAST metadata: give --db, this site's replica of the database", a.metadata.display()) };
                    let p = BlastPlugin::storage_site(db).with_threads(a.threads.unwrap_or_else(cores));
                    let out = container::open(&p, &data);
                    if p.last_went_per_query() {
                        say!("gepsea paramedic: the search over all subjects differed (a query overflowed BLAST's preliminary hit list): regenerated per query, {} BLAST+ runs", p.last_runs());
                    }
                    out
                }
                other => match paramedic::storage::decoder(other, None, 1) {
                    Some(p) => container::open(p.as_ref(), &data),
                    None => bail!("{}: made by plug-in {other:?}, which this build does not have", a.metadata.display()),
                },
            }
            .with_context(|| format!("{}", a.metadata.display()))?;
            write_atomically(&a.out, &output)?;
            say!("gepsea paramedic: regenerated {} bytes from {} bytes of {name} metadata, {}", output.len(), data.len(), a.out.display());
            Ok(())
        }
    }
}
