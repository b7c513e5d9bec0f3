//! `combs bench --profile` as a user runs it: the built binary on a tiny
//! synthetic file through the Vulkan kernels (lavapipe here), whose profile
//! gives each pass's GPU time by kernel and its first dispatches in order.

use std::path::PathBuf;
use std::process::Command;

fn combs(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_combs"))
        .args(args)
        .output()
        .expect("the combs binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The µs of each line of an "in order" list after `header` in `text`.
fn in_order(text: &str, header: &str) -> Vec<(String, f64)> {
    let Some(at) = text.find(header) else {
        return Vec::new();
    };
    text[at..]
        .lines()
        .skip_while(|l| !l.contains("dispatches in order:"))
        .skip(1)
        .map_while(|l| {
            let l = l.trim();
            let (name, rest) = l.split_once(char::is_whitespace)?;
            let us = rest.trim().strip_suffix(" us")?.trim().parse().ok()?;
            Some((name.to_string(), us))
        })
        .collect()
}

#[test]
fn bench_profile_lists_dispatches_in_order() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli_bench_{}.gguf", std::process::id()));
    let file = path.to_str().expect("utf-8 path");
    let (ok, _, err) = combs(&["synth", "--preset", "tiny", "--type", "q4_0", "-o", file]);
    assert!(ok, "synth: {err}");
    let (ok, out, err) = combs(&[
        "bench",
        "-m",
        file,
        "--kernels",
        "vulkan",
        "-p",
        "16",
        "-n",
        "2",
        "-r",
        "1",
        "--profile",
    ]);
    std::fs::remove_file(&path).ok();
    assert!(ok, "bench: {err}\n{out}");
    for pass in ["forward pass of 16 token(s)", "forward pass of 1 token(s)"] {
        assert!(out.contains(pass), "no profile of the {pass}:\n{out}");
        let list = in_order(&out, pass);
        // The embedding's gather first, then the first block's products.
        assert!(
            (2..=12).contains(&list.len()),
            "{pass}: {} dispatches listed:\n{out}",
            list.len()
        );
        assert!(list[0].0.starts_with("get_rows"), "{pass}: {list:?}");
        assert!(
            list.iter()
                .any(|(k, _)| k.starts_with("matvec") || k.starts_with("matmul")),
            "{pass}: no product among {list:?}"
        );
        assert!(
            list.iter().all(|(_, us)| us.is_finite() && *us >= 0.0),
            "{pass}: {list:?}"
        );
    }
}
