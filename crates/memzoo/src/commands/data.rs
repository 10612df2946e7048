//! `memzoo data list | fetch | prepare | stats`: the data sets, downloaded, built (rust-code)
//! and checked end to end.

use std::path::{Path, PathBuf};
use std::time::Instant;

use memzoo_data::{Manifest, RustCodeManifest, rust_code};
use serde_json::json;

use crate::data_setup::load_corpus;
use crate::error::CliError;

/// `memzoo data list`.
pub fn data_list() -> Result<(), CliError> {
    for m in Manifest::all()? {
        println!("{:16} {:>12} bytes  {}", m.name, m.size, m.description);
    }
    let code = RustCodeManifest::embedded()?;
    println!(
        "{:16} {:>12} bytes  {} ({} crates; `memzoo data prepare rust-code`, no download)",
        code.name, code.bytes, code.description, code.documents
    );
    Ok(())
}

/// `memzoo data fetch`.
pub fn data_fetch(name: &str, dir: &Path, url: Option<String>) -> Result<(), CliError> {
    if name == rust_code::NAME {
        return Err(CliError::Conflict(format!(
            "{name} is not downloaded: it is built from cargo's registry sources of the crates in \
             memzoo's Cargo.lock; run `memzoo data prepare {name} --dir {}`",
            dir.display()
        )));
    }
    let manifest = Manifest::load(name)?;
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let path: PathBuf = match url {
        Some(url) => memzoo_data::fetch_from(&url, &manifest, dir, progress),
        None => memzoo_data::fetch(&manifest, dir, progress),
    }?;
    println!("{}", path.display());
    Ok(())
}

fn source_config(source: &str, dir: &Path) -> crate::config::DataConfig {
    crate::config::DataConfig {
        source: Some(source.to_string()),
        data_dir: dir.display().to_string(),
        ..Default::default()
    }
}

/// `memzoo data prepare`: load, split and report sizes (checks the file end to end).
pub fn data_prepare(source: &str, dir: &Path, json_out: bool) -> Result<(), CliError> {
    if source == rust_code::NAME {
        return prepare_rust_code(dir, json_out);
    }
    let (name, corpus) = load_corpus(&source_config(source, dir))?;
    if json_out {
        println!(
            "{}",
            json!({"source": name, "train": corpus.train.len(), "valid": corpus.valid.len(), "test": corpus.test.len()})
        );
    } else {
        println!(
            "{name}: train {} bytes, valid {} bytes, test {} bytes",
            corpus.train.len(),
            corpus.valid.len(),
            corpus.test.len()
        );
    }
    Ok(())
}

/// `memzoo data prepare rust-code`: reads the pinned crates from cargo's registry sources,
/// verifies them and writes `dir/rust-code/`.
fn prepare_rust_code(dir: &Path, json_out: bool) -> Result<(), CliError> {
    let start = Instant::now();
    let manifest = RustCodeManifest::embedded()?;
    let out = crate::data_setup::rust_code_dir(&source_config(rust_code::NAME, dir));
    let s = rust_code::prepare(&manifest, &rust_code::registry_src_dirs(), &out)?;
    let secs = start.elapsed().as_secs_f64();
    if json_out {
        println!(
            "{}",
            json!({"source": rust_code::NAME, "summary": s, "seconds": secs})
        );
        return Ok(());
    }
    let splits: Vec<String> = s
        .splits
        .iter()
        .map(|p| format!("{} {} docs, {} bytes", p.split, p.docs, p.bytes))
        .collect();
    println!(
        "{}: {}; {} .rs files; sha256 {} {} ({secs:.1}s) in {}",
        rust_code::NAME,
        splits.join(", "),
        s.files,
        s.sha256,
        if s.verified {
            "verified"
        } else {
            "(a selection: not checked)"
        },
        s.dir.display()
    );
    Ok(())
}

/// `memzoo data stats`.
pub fn data_stats(source: &str, dir: &Path, json_out: bool) -> Result<(), CliError> {
    let (name, corpus) = load_corpus(&source_config(source, dir))?;
    for (split, bytes) in [
        ("train", &corpus.train),
        ("valid", &corpus.valid),
        ("test", &corpus.test),
    ] {
        let s = memzoo_data::byte_stats(bytes);
        if json_out {
            println!(
                "{}",
                json!({"source": name, "split": split, "tokens": s.tokens, "distinct": s.distinct,
                       "unigram_entropy_bits": s.unigram_entropy_bits})
            );
        } else {
            println!(
                "{name} {split}: {} tokens, {} distinct, unigram entropy {:.3} bits/char",
                s.tokens, s.distinct, s.unigram_entropy_bits
            );
        }
    }
    Ok(())
}
