//! The `images` scenario: what a turn whose message names a 1 MiB PNG by
//! its file id costs beside a text-only turn, in the same process and
//! run (the image's bytes read from the database and sent to the
//! provider as a data URL on each call).

use std::sync::Arc;

use crate::{
    client::{self, Target},
    fake::Spec,
    procs::Proc,
    scenarios::{ok, totals},
    stats::p50_p99,
};

/// The image's size.
const IMAGE_BYTES: usize = 1024 * 1024;

/// The largest file the service takes by default: what another tenant's
/// uploads write while the text turns run.
const LARGE_BYTES: usize = 20 * 1024 * 1024;

/// A PNG of `size` bytes: its signature, then pseudo-random bytes from
/// `seed` (they do not compress; another seed, other bytes).
fn png(size: usize, seed: u32) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x: u32 = 2_463_534_242 ^ seed;
    while bytes.len() < size {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(size);
    bytes
}

/// Uploads `png` to the service at `base` (`POST /files`); its id.
async fn upload(http: &reqwest::Client, base: &str, png: &[u8]) -> Result<String, String> {
    let boundary = "bench-boundary-7f3a";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bench.png\"\r\n\
         Content-Type: image/png\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(png);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let response = http
        .post(format!("{base}/files"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .map_err(|e| format!("upload: {e}"))?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("upload: {status}: {text}"));
    }
    let file: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    file["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("upload: no id in {text}"))
}

pub(crate) async fn run(harness: &Proc, scale: usize) -> Result<(), String> {
    let spec = Spec::realistic();
    println!(
        "## images: a one-step turn naming a 1 MiB PNG by file id, beside a text-only turn, \
         c=32, {} tokens, {} µs of provider work per chunk\n",
        spec.tokens, spec.cost_us
    );
    let http = client::http_client();
    let file_id: Arc<str> = upload(&http, &harness.url(), &png(IMAGE_BYTES, 0))
        .await?
        .into();
    let model = spec.model();
    let text = Target::Harness {
        base: harness.url(),
    };
    let image = Target::HarnessImage {
        base: harness.url(),
        file_id,
    };
    println!("| turn | turns/s | p50 | p99 | errors | server CPU | CPU/turn | RSS after |");
    println!("|---|---|---|---|---|---|---|---|");
    client::load(&http, &image, &model, 8, 100 / scale).await;
    let total = 2000 / scale;
    for (name, target, uploading) in [
        ("text only", &text, false),
        ("1 MiB PNG by file id", &image, false),
        ("text only, 20 MiB uploads beside", &text, true),
    ] {
        let stop = tokio_util::sync::CancellationToken::new();
        let uploads = uploading
            .then(|| tokio::spawn(upload_until(http.clone(), harness.url(), stop.clone())));
        let cpu_before = harness.cpu();
        let (samples, wall) = client::load(&http, target, &model, 32, total).await;
        let cpu = harness.cpu().saturating_sub(cpu_before);
        stop.cancel();
        let uploaded = match uploads {
            Some(task) => task.await.map_err(|e| e.to_string())??,
            None => 0,
        };
        let name = if uploading {
            format!("{name} ({uploaded} uploaded)")
        } else {
            name.to_owned()
        };
        let (good, errors) = ok(&samples);
        let (p50, p99) = p50_p99(&totals(&good));
        println!(
            "| {name} | {:.0} | {p50:.2} ms | {p99:.2} ms | {errors} | {:.0}% | {:.3} ms | {:.0} MiB |",
            good.len() as f64 / wall.as_secs_f64(),
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
            cpu.as_secs_f64() * 1000.0 / good.len().max(1) as f64,
            harness.rss_kib() as f64 / 1024.0,
        );
    }
    println!();
    Ok(())
}

/// Uploads 20 MiB files one after another (each other bytes, deleted
/// once stored) until `stop`: how many.
async fn upload_until(
    http: reqwest::Client,
    base: String,
    stop: tokio_util::sync::CancellationToken,
) -> Result<usize, String> {
    let mut uploaded = 0;
    while !stop.is_cancelled() {
        let bytes = png(LARGE_BYTES, u32::try_from(uploaded + 1).unwrap_or(u32::MAX));
        let id = upload(&http, &base, &bytes).await?;
        http.delete(format!("{base}/files/{id}"))
            .send()
            .await
            .map_err(|e| format!("delete: {e}"))?;
        uploaded += 1;
    }
    Ok(uploaded)
}
