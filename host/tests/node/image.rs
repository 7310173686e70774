//! The product image as the tests build it from the release build, and what the `Dockerfile`
//! says the image holds, so one test can keep the two the same.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use testenv::{ImageFile, ImageSpec};

/// The name `manifests/host.yaml` runs.
pub const IMAGE: &str = "wasm-controller-manager:latest";

/// The libraries the distroless `cc-debian12` base ships for a Rust binary (glibc's, libgcc_s and
/// the loader): a binary that needs another one would not run from the `Dockerfile`'s image.
pub const BASE_LIBRARIES: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
];

/// What the base image gives every image built on it (files the tests copy from this machine).
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n";
const CA_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The release build of the host, next to the debug build cargo made for this test.
pub fn release_binary() -> Result<PathBuf> {
    let debug = PathBuf::from(env!("CARGO_BIN_EXE_wasm-controller-manager"));
    let release = debug
        .parent()
        .and_then(Path::parent)
        .map(|target| target.join("release/wasm-controller-manager"))
        .context("the target directory")?;
    anyhow::ensure!(
        release.is_file(),
        "no release build at {} (the image is built from it, as the Dockerfile does): run `cargo build --release --locked -p wasm-controller-manager` first (scripts/test does)",
        release.display()
    );
    Ok(release)
}

/// The shared libraries `ldd` lists for `binary`, by the path they were found at.
pub fn libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .context("run ldd")?;
    anyhow::ensure!(out.status.success(), "ldd {} failed", binary.display());
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

fn file(path: &str, source: PathBuf, mode: u32) -> ImageFile {
    ImageFile {
        path: path.into(),
        source: Some(source),
        mode,
        ..Default::default()
    }
}

fn dir(path: &str, mode: u32, owner: u32) -> ImageFile {
    ImageFile {
        path: path.into(),
        dir: true,
        mode,
        uid: owner,
        gid: owner,
        ..Default::default()
    }
}

fn content(path: &str, text: &str) -> ImageFile {
    ImageFile {
        path: path.into(),
        content: Some(text.into()),
        mode: 0o644,
        ..Default::default()
    }
}

/// The image of the `Dockerfile`, assembled from what this machine built: the base image's part
/// (the libraries the binary links, CA roots, passwd/group with `nonroot` 65532, /tmp, the
/// `nonroot` home) and the product's part (`product_paths`).
pub fn product_image(
    name: &str,
    release: &Path,
    pod_counter: &Path,
    network: &Path,
) -> Result<ImageSpec> {
    let mut files = vec![
        content("/etc/passwd", PASSWD),
        content("/etc/group", GROUP),
        file(CA_ROOTS, PathBuf::from(CA_ROOTS), 0o644),
        dir("/tmp", 0o1777, 0),
        dir("/home/nonroot", 0o700, 65532),
    ];
    for lib in libraries(release)? {
        let path = lib.to_string_lossy().into_owned();
        files.push(file(&path, lib, 0o755));
    }
    files.extend([
        file(
            "/usr/local/bin/wasm-controller-manager",
            release.into(),
            0o755,
        ),
        file(
            "/opt/wasm-controller-manager/plugins-available/pod_counter.wasm",
            pod_counter.into(),
            0o644,
        ),
        file(
            "/opt/wasm-controller-manager/plugins-available/network.wasm",
            network.into(),
            0o644,
        ),
        file("/plugins/pod_counter.wasm", pod_counter.into(), 0o644),
        dir("/var/cache/wcm", 0o755, 65532),
    ]);
    Ok(ImageSpec {
        name: name.into(),
        entrypoint: vec!["/usr/local/bin/wasm-controller-manager".into()],
        cmd: vec![
            "run".into(),
            "--plugins-dir=/plugins".into(),
            "--compile-cache=/var/cache/wcm/compiled".into(),
        ],
        user: "65532:65532".into(),
        env: vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            format!("SSL_CERT_FILE={CA_ROOTS}"),
        ],
        working_dir: "/".into(),
        files,
    })
}

/// An entry the product puts in the image: path, whether a directory, owner.
pub type Entry = (String, bool, u32);

/// The product's entries of a spec: everything but the base image's part.
pub fn product_entries(spec: &ImageSpec) -> BTreeSet<Entry> {
    let base = ["/etc/", "/tmp", "/home/", "/lib", "/usr/lib"];
    spec.files
        .iter()
        .filter(|f| !base.iter().any(|b| f.path.starts_with(b)))
        .map(|f| (f.path.clone(), f.dir, f.uid))
        .collect()
}

/// What the `Dockerfile`'s final stage puts in the image, and how it runs it.
#[derive(Debug, Default)]
pub struct DockerfileImage {
    pub entries: BTreeSet<Entry>,
    pub user: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// Reads the `Dockerfile`: the final stage's COPY lines (a directory copied from a stage's /out/
/// holds the files that stage's `cp … /out/` put there), USER, ENTRYPOINT and CMD (exec form).
pub fn dockerfile_image(text: &str) -> Result<DockerfileImage> {
    // Join continuation lines, drop comments.
    let mut lines = Vec::new();
    let mut cur = String::new();
    for raw in text.lines() {
        let t = raw.trim();
        if t.starts_with('#') {
            continue;
        }
        if let Some(part) = t.strip_suffix('\\') {
            cur.push_str(part);
            cur.push(' ');
        } else {
            cur.push_str(t);
            if !cur.trim().is_empty() {
                lines.push(cur.trim().to_string());
            }
            cur.clear();
        }
    }
    // Files each stage copies into /out/ with `cp A B … /out/`.
    let mut stage = String::new();
    let mut out_files: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut final_start = 0;
    for (i, l) in lines.iter().enumerate() {
        if let Some(rest) = l.strip_prefix("FROM ") {
            stage = rest
                .split_once(" AS ")
                .map(|(_, s)| s.trim().to_string())
                .unwrap_or_default();
            final_start = i;
        }
        for cmd in l.split("&&") {
            let words: Vec<&str> = cmd.split_whitespace().collect();
            if let Some(pos) = words.iter().position(|w| *w == "cp")
                && words.last() == Some(&"/out/")
            {
                for w in &words[pos + 1..words.len() - 1] {
                    if let Some(name) = Path::new(w).file_name() {
                        out_files
                            .entry(stage.clone())
                            .or_default()
                            .push(name.to_string_lossy().into_owned());
                    }
                }
            }
        }
    }
    let mut image = DockerfileImage::default();
    for l in &lines[final_start..] {
        let words: Vec<&str> = l.split_whitespace().collect();
        match words.first() {
            Some(&"COPY") => {
                let from = words
                    .iter()
                    .find_map(|w| w.strip_prefix("--from="))
                    .unwrap_or("");
                let owner = words
                    .iter()
                    .find_map(|w| w.strip_prefix("--chown="))
                    .and_then(|o| o.split(':').next())
                    .map(|u| u.parse::<u32>())
                    .transpose()?
                    .unwrap_or(0);
                let args: Vec<&str> = words[1..]
                    .iter()
                    .copied()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let [src, dst] = args[..] else {
                    bail!("COPY with other than one source: {l}")
                };
                if src.ends_with('/') {
                    let dst = dst.trim_end_matches('/');
                    let files = out_files.get(from).cloned().unwrap_or_default();
                    if files.is_empty() {
                        image.entries.insert((dst.to_string(), true, owner));
                    }
                    for f in files {
                        image.entries.insert((format!("{dst}/{f}"), false, owner));
                    }
                } else {
                    image.entries.insert((dst.to_string(), false, owner));
                }
            }
            Some(&"USER") => image.user = words[1..].join(" "),
            Some(&"ENTRYPOINT") => image.entrypoint = serde_json::from_str(&l[10..])?,
            Some(&"CMD") => image.cmd = serde_json::from_str(&l[3..])?,
            _ => {}
        }
    }
    Ok(image)
}
