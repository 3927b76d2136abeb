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

/// A PNG's signature, then pseudo-random bytes (they do not compress).
fn png() -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x: u32 = 2_463_534_242;
    while bytes.len() < IMAGE_BYTES {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(IMAGE_BYTES);
    bytes
}

/// Uploads the image to `POST /files`; its id.
async fn upload(http: &reqwest::Client, harness: &Proc) -> Result<String, String> {
    let boundary = "bench-boundary-7f3a";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bench.png\"\r\n\
         Content-Type: image/png\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&png());
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let response = http
        .post(format!("{}/files", harness.url()))
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
    let file_id: Arc<str> = upload(&http, harness).await?.into();
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
    for (name, target) in [("text only", &text), ("1 MiB PNG by file id", &image)] {
        let cpu_before = harness.cpu();
        let (samples, wall) = client::load(&http, target, &model, 32, total).await;
        let cpu = harness.cpu().saturating_sub(cpu_before);
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
