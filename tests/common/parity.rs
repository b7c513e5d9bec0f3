//! Helpers shared by the real-model parity tests (`tests/parity_*.rs`): the
//! llama.cpp fixtures that `scripts/make-llama-fixtures.py` writes under
//! `tests/fixtures/llama/`, the model cache, and the three comparisons —
//! teacher-forced logits, greedy generation, perplexity — each returning the
//! measured numbers so a test can print them before it checks them.
//!
//! What is compared follows the fixture script's header: per position, combs'
//! argmax against llama.cpp's, and combs' logits at llama.cpp's top-8 ids
//! against llama.cpp's values; greedy tokens from an empty context; and the
//! perplexity of `combs::runtime::perplexity` (llama.cpp's method) against
//! the running values `llama-perplexity` printed. On top of them, the
//! checks every model's test runs on a [`Case`] (one file and its fixture):
//! [`check_teacher`], [`check_greedy`], [`check_perplexity`].

#![allow(dead_code)]

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use combs::models::LoadOptions;
use combs::ops::act_round::Numerics;
use combs::runtime::model::model_cache_dir;
use combs::runtime::perplexity::{PerplexityReport, perplexity};
use combs::runtime::sampler::argmax;
use combs::runtime::{Model, Session, SessionOptions};
use combs::tokenizer::ChatMessage;
use serde_json::Value;

/// Where the llama.cpp fixtures live: under `COMBS_SOURCE_DIR` where it
/// is set (a test binary carried to another machine, away from the tree
/// it was built in), else under the tree it was built in.
pub fn fixture_dir() -> PathBuf {
    std::env::var_os("COMBS_SOURCE_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("tests/fixtures/llama")
}

/// A fixture file of `fixture_dir()`, parsed.
pub fn read_fixture(name: &str) -> Value {
    let path = fixture_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (written by scripts/make-llama-fixtures.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `v[key]`, which the fixture must have.
pub fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key)
        .unwrap_or_else(|| panic!("fixture field {key:?} missing"))
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of token ids")
        .iter()
        .map(|x| x.as_u64().expect("token id") as u32)
        .collect()
}

/// A JSON array of numbers.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array of numbers")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// The SHA-256 of a file as lowercase hex, from coreutils' `sha256sum`
/// (`None` where it cannot be run).
pub fn sha256_of(path: &Path) -> Option<String> {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(str::to_owned)
}

/// Checks that `path` is the file a fixture was made from: comparing against
/// numbers from a different file would only measure the difference of files.
pub fn check_same_file(path: &Path, want_sha256: &str, how_to_get: &str) {
    match sha256_of(path) {
        Some(got) => assert_eq!(
            got,
            want_sha256,
            "{} is not the file the llama.cpp fixtures were made from ({how_to_get})",
            path.display()
        ),
        None => eprintln!(
            "note: sha256sum unavailable, {} not checked against the fixture",
            path.display()
        ),
    }
}

/// A model file in the cache; a missing one fails with what makes it.
pub fn model_path(file: &str) -> PathBuf {
    let path = model_cache_dir().join(file);
    assert!(
        path.exists(),
        "{} missing: scripts/fetch-models.sh fetches SmolLM2 Q4_1 and Gemma 3, \
         scripts/setup-llamacpp.sh requantizes SmolLM2's other types",
        path.display()
    );
    path
}

/// Loads a model on the test GPU with the given linear-layer numerics.
pub fn load_model(ctx: &Arc<combs::gpu::GpuContext>, path: &Path, numerics: Numerics) -> Model {
    let opts = LoadOptions {
        numerics,
        ..LoadOptions::default()
    };
    Model::load(ctx, path, &opts).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// A session of `n_ctx` positions that can return up to 512 logit rows at once.
pub fn session(model: &Model, n_ctx: usize) -> Session {
    model
        .new_session(&SessionOptions {
            n_ctx,
            n_batch: 512,
            n_logit_rows: 512,
            ..Default::default()
        })
        .expect("session")
}

/// A session that can return every logit row of a 512-token window.
pub fn session_512(model: &Model) -> Session {
    session(model, 512)
}

// ---------------------------------------------------------------- one file under test

/// One model file with its llama.cpp fixture and the shared inputs of its
/// model (texts, windows, prompts, llama.cpp's tokens).
pub struct Case {
    /// Label of its log lines (`Q4_1`, `gemma3 Q4_K_M`).
    pub label: String,
    /// Start of the names of dumped logit files (`smollm2-Q4_1`).
    pub dump_prefix: String,
    pub model: Model,
    pub inputs: &'static Value,
    pub fixture: Value,
    /// Context of the sessions: llama.cpp's `n_ctx` in the fixture's settings.
    pub n_ctx: usize,
}

impl Case {
    /// Loads the file that fixture `fixture_file` names from the model cache
    /// (checking its SHA-256 against the fixture's) with the given numerics.
    pub fn load(
        ctx: &Arc<combs::gpu::GpuContext>,
        inputs: &'static Value,
        fixture_file: &str,
        label: &str,
        dump_prefix: &str,
        numerics: Numerics,
    ) -> Case {
        let fixture = read_fixture(fixture_file);
        let file = field(&fixture, "model").as_str().expect("model file name");
        let path = model_path(file);
        check_same_file(
            &path,
            field(&fixture, "sha256").as_str().expect("sha256"),
            "re-fetch it (scripts/fetch-models.sh, scripts/setup-llamacpp.sh), or re-run \
             scripts/make-llama-fixtures.py",
        );
        let n_ctx = fixture
            .get("settings")
            .and_then(|s| s.get("n_ctx"))
            .and_then(Value::as_u64)
            .map_or(512, |n| n as usize);
        Case {
            label: label.to_string(),
            dump_prefix: dump_prefix.to_string(),
            model: load_model(ctx, &path, numerics),
            inputs,
            fixture,
            n_ctx,
        }
    }

    /// A session as large as llama.cpp's context was.
    pub fn session(&self) -> Session {
        session(&self.model, self.n_ctx)
    }

    /// The text of a token (`<id>` where it has none).
    pub fn piece(&self, t: u32) -> String {
        self.model
            .tokenizer()
            .token_to_piece(t)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|_| format!("<{t}>"))
    }

    /// The text of tokens.
    pub fn text(&self, tokens: &[u32]) -> String {
        tokens.iter().map(|&t| self.piece(t)).collect()
    }
}

// ---------------------------------------------------------------- teacher forcing

/// llama.cpp's rows of one teacher-forcing window: per position the
/// logsumexp and the 8 best ids with their logits (best first); and, where
/// the fixture has them, two baselines: the argmax of llama.cpp with flash
/// attention off (how far llama.cpp moves from itself), and an exact f64
/// forward of the same dequantized weights (argmax, and its logits at
/// llama.cpp's 8 ids).
pub struct TopK {
    pub lse: Vec<f64>,
    pub ids: Vec<Vec<u32>>,
    pub logits: Vec<Vec<f64>>,
    pub argmax_fa_off: Option<Vec<u32>>,
    pub ref_argmax: Option<Vec<u32>>,
    pub ref_logits: Option<Vec<Vec<f64>>>,
}

impl TopK {
    /// From a fixture's `teacher.<window>` object.
    pub fn from_json(v: &Value) -> Self {
        let rows = |k: &str| field(v, k).as_array().expect("rows").clone();
        TopK {
            lse: floats(field(v, "lse")),
            ids: rows("top_ids").iter().map(ids).collect(),
            logits: rows("top_logits").iter().map(floats).collect(),
            argmax_fa_off: v.get("argmax_fa_off").map(ids),
            ref_argmax: v.get("ref_argmax").map(ids),
            ref_logits: v
                .get("ref_logits")
                .map(|r| r.as_array().expect("rows").iter().map(floats).collect()),
        }
    }
}

/// A position where the argmaxes differ.
#[derive(Debug)]
pub struct Mismatch {
    /// Position in the window (its logits predict token `pos + 1`).
    pub pos: usize,
    /// combs' argmax and llama.cpp's.
    pub ours: u32,
    pub theirs: u32,
    /// combs' logit of its argmax minus combs' logit of llama.cpp's argmax (≥ 0).
    pub our_margin: f64,
    /// llama.cpp's logit of its argmax minus llama.cpp's logit of combs'
    /// argmax, when that id is in llama.cpp's top-8.
    pub their_margin: Option<f64>,
    /// The f64 reference's argmax there, when the fixture has it.
    pub ref_argmax: Option<u32>,
    /// llama.cpp's argmax with flash attention off, when the fixture has it.
    pub fa_off_argmax: Option<u32>,
}

/// Agreement and logit distance of combs against one set of rows.
#[derive(Debug, Default)]
pub struct Distance {
    pub agree: usize,
    /// Over llama.cpp's top-8 ids of every position.
    pub max_abs_diff: f64,
    pub mean_abs_diff: f64,
    /// Position of `max_abs_diff`.
    pub max_pos: usize,
}

/// The outcome of comparing one window.
#[derive(Debug)]
pub struct TeacherReport {
    pub n: usize,
    /// combs against llama.cpp.
    pub llama: Distance,
    /// max |combs logsumexp − llama.cpp logsumexp| over positions.
    pub max_lse_diff: f64,
    /// combs against the f64 reference forward (when the fixture has it).
    pub reference: Option<Distance>,
    /// Positions where llama.cpp with flash attention off has llama.cpp's
    /// (flash attention on) argmax, when the fixture has it.
    pub fa_off_agree: Option<usize>,
    /// Positions where the f64 reference has llama.cpp's argmax.
    pub ref_llama_agree: Option<usize>,
    pub mismatches: Vec<Mismatch>,
}

/// Whether `agree` of `n` is at least 99% (integer arithmetic: with 128
/// positions at most one may differ).
pub fn meets_99pct(agree: usize, n: usize) -> bool {
    agree * 100 >= n * 99
}

fn pct(a: usize, n: usize) -> f64 {
    100.0 * a as f64 / n.max(1) as f64
}

impl TeacherReport {
    /// Agreement with llama.cpp in percent.
    pub fn agreement_pct(&self) -> f64 {
        pct(self.llama.agree, self.n)
    }

    /// Whether at least 99% of positions agree with llama.cpp.
    pub fn meets_99pct(&self) -> bool {
        meets_99pct(self.llama.agree, self.n)
    }

    /// Lines for the log.
    pub fn summary(&self) -> Vec<String> {
        let n = self.n;
        let mut out = vec![format!(
            "combs vs llama.cpp: argmax agreement {}/{n} = {:.2}%, max |logit diff| {:.4} (pos {}), \
             mean {:.4} (over llama.cpp's top-8), max |logsumexp diff| {:.4}",
            self.llama.agree,
            self.agreement_pct(),
            self.llama.max_abs_diff,
            self.llama.max_pos,
            self.llama.mean_abs_diff,
            self.max_lse_diff
        )];
        if let Some(r) = &self.reference {
            out.push(format!(
                "combs vs f64 reference: argmax agreement {}/{n} = {:.2}%, max |logit diff| {:.4} \
                 (pos {}), mean {:.4}",
                r.agree,
                pct(r.agree, n),
                r.max_abs_diff,
                r.max_pos,
                r.mean_abs_diff
            ));
        }
        if let Some(a) = self.ref_llama_agree {
            out.push(format!(
                "baseline: f64 reference vs llama.cpp argmax agreement {a}/{n} = {:.2}%",
                pct(a, n)
            ));
        }
        if let Some(a) = self.fa_off_agree {
            out.push(format!(
                "baseline: llama.cpp flash-attn off vs on argmax agreement {a}/{n} = {:.2}%",
                pct(a, n)
            ));
        }
        out
    }
}

fn logsumexp(row: &[f32]) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    m + row.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln()
}

/// Adds one position to a distance: combs' `row` against `(ids, logits)`.
fn accumulate(
    d: &mut Distance,
    sum: &mut f64,
    pos: usize,
    row: &[f32],
    ids: &[u32],
    logits: &[f64],
) {
    for (&id, &l) in ids.iter().zip(logits) {
        let x = (row[id as usize] as f64 - l).abs();
        *sum += x;
        if x > d.max_abs_diff {
            d.max_abs_diff = x;
            d.max_pos = pos;
        }
    }
}

/// Evaluates a window of `tokens` from an empty context and compares combs'
/// logit rows at the positions of `rows` (ascending, disjoint ranges, within
/// the window and llama.cpp's rows) with llama.cpp's: the tokens between
/// ranges run through a plain prefill (no logits), so scoring a few rows
/// past a long prefix costs the prefix's forward pass but not its output
/// head. With `COMBS_PARITY_DUMP=DIR` set, the scored rows are also written
/// to `DIR/<dump_name>.f32` (rows × n_vocab little-endian f32, in order) for
/// offline diagnosis.
pub fn teacher_forcing(
    session: &mut Session,
    tokens: &[u32],
    want: &TopK,
    rows: &[Range<usize>],
    dump_name: &str,
) -> TeacherReport {
    let end = tokens.len().min(want.ids.len());
    let rows: Vec<Range<usize>> = rows
        .iter()
        .map(|r| r.start.min(end)..r.end.min(end))
        .filter(|r| !r.is_empty())
        .collect();
    assert!(
        rows.windows(2).all(|w| w[0].end <= w[1].start),
        "teacher-forcing rows must ascend: {rows:?}"
    );
    session.clear();
    let mut all = Vec::new();
    let mut at = 0;
    for r in &rows {
        if r.start > at {
            session.prefill(&tokens[at..r.start]).expect("prefill");
        }
        all.extend(
            session
                .prefill_all_logits(&tokens[r.clone()])
                .expect("prefill_all_logits"),
        );
        at = r.end;
    }
    let positions: Vec<usize> = rows.iter().flat_map(Clone::clone).collect();
    let n = positions.len();
    if let Some(dir) = std::env::var_os("COMBS_PARITY_DUMP") {
        let path = Path::new(&dir).join(format!("{dump_name}.f32"));
        let bytes: Vec<u8> = all.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("logits of positions {rows:?} written to {}", path.display());
    }
    let n_vocab = all.len() / n.max(1);
    let k = want.ids.first().map_or(1, Vec::len);
    let has_ref = want.ref_argmax.is_some() && want.ref_logits.is_some();
    let count = |a: &Option<Vec<u32>>| {
        a.as_ref().map(|a| {
            positions
                .iter()
                .filter(|&&p| a[p] == want.ids[p][0])
                .count()
        })
    };
    let mut r = TeacherReport {
        n,
        llama: Distance::default(),
        max_lse_diff: 0.0,
        reference: has_ref.then(Distance::default),
        fa_off_agree: count(&want.argmax_fa_off),
        ref_llama_agree: count(&want.ref_argmax),
        mismatches: Vec::new(),
    };
    let (mut sum, mut ref_sum) = (0.0, 0.0);
    for (i, &pos) in positions.iter().enumerate() {
        let row = &all[i * n_vocab..(i + 1) * n_vocab];
        let (ids, logits) = (&want.ids[pos], &want.logits[pos]);
        accumulate(&mut r.llama, &mut sum, pos, row, ids, logits);
        r.max_lse_diff = r.max_lse_diff.max((logsumexp(row) - want.lse[pos]).abs());
        let ours = argmax(row) as u32;
        if let (Some(d), Some(ra), Some(rl)) =
            (&mut r.reference, &want.ref_argmax, &want.ref_logits)
        {
            accumulate(d, &mut ref_sum, pos, row, ids, &rl[pos]);
            d.agree += usize::from(ours == ra[pos]);
        }
        if ours == ids[0] {
            r.llama.agree += 1;
        } else {
            r.mismatches.push(Mismatch {
                pos,
                ours,
                theirs: ids[0],
                our_margin: (row[ours as usize] - row[ids[0] as usize]) as f64,
                their_margin: ids
                    .iter()
                    .position(|&i| i == ours)
                    .map(|k| logits[0] - logits[k]),
                ref_argmax: want.ref_argmax.as_ref().map(|a| a[pos]),
                fa_off_argmax: want.argmax_fa_off.as_ref().map(|a| a[pos]),
            });
        }
    }
    r.llama.mean_abs_diff = sum / (n * k).max(1) as f64;
    if let Some(d) = &mut r.reference {
        d.mean_abs_diff = ref_sum / (n * k).max(1) as f64;
    }
    r
}

/// Prints a window's report and its mismatches (with the tokens involved).
pub fn print_teacher(
    label: &str,
    r: &TeacherReport,
    tokens: &[u32],
    piece: impl Fn(u32) -> String,
) {
    for line in r.summary() {
        eprintln!("[{label}] {line}");
    }
    for m in &r.mismatches {
        let opt = |x: Option<u32>| x.map_or("-".to_string(), |t| format!("{t} {:?}", piece(t)));
        eprintln!(
            "[{label}]   pos {:>3} after {:?}: combs {} {:?}, llama.cpp {} {:?}; margin combs {:.4}, \
             llama.cpp {}; f64 ref {}, llama.cpp fa-off {}",
            m.pos,
            piece(tokens[m.pos]),
            m.ours,
            piece(m.ours),
            m.theirs,
            piece(m.theirs),
            m.our_margin,
            m.their_margin
                .map_or("(not in its top-8)".to_string(), |x| format!("{x:.4}")),
            opt(m.ref_argmax),
            opt(m.fa_off_argmax),
        );
    }
}

// ---------------------------------------------------------------- greedy

/// Greedy generation and where it left llama.cpp's tokens.
#[derive(Debug)]
pub struct GreedyReport {
    pub ours: Vec<u32>,
    pub theirs: Vec<u32>,
    /// Length of the common prefix.
    pub n_match: usize,
    /// combs' top-2 logit margin at each step.
    pub margins: Vec<f64>,
}

/// Generates `n` tokens greedily (argmax of the raw logits, the prompt in one
/// batch, then one decode step per token, not stopping at end-of-generation
/// tokens) from an empty context.
pub fn greedy(session: &mut Session, prompt: &[u32], n: usize, theirs: &[u32]) -> GreedyReport {
    session.clear();
    session.prefill(prompt).expect("prefill");
    let mut ours = Vec::with_capacity(n);
    let mut margins = Vec::with_capacity(n);
    for i in 0..n {
        let logits = session.logits();
        let t = argmax(logits) as u32;
        let second = logits
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != t as usize)
            .map(|(_, &l)| l)
            .fold(f32::NEG_INFINITY, f32::max);
        margins.push((logits[t as usize] - second) as f64);
        ours.push(t);
        if i + 1 < n {
            session.decode(t).expect("decode");
        }
    }
    let n_match = common_prefix(&ours, theirs);
    GreedyReport {
        ours,
        theirs: theirs[..n.min(theirs.len())].to_vec(),
        n_match,
        margins,
    }
}

/// Length of the common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

// ---------------------------------------------------------------- perplexity

/// combs' perplexity over the first `n_chunks` chunks of 512 of `tokens`
/// (BOS replaces each chunk's first token when the model adds one), printing
/// the running value after every chunk beside llama.cpp's.
pub fn perplexity_chunks(
    label: &str,
    session: &mut Session,
    tokens: &[u32],
    bos: Option<u32>,
    n_chunks: usize,
    theirs: &[f64],
) -> PerplexityReport {
    let tokens = &tokens[..(n_chunks * 512).min(tokens.len())];
    let t0 = std::time::Instant::now();
    perplexity(session, tokens, 512, bos, |i, ppl| {
        let want = theirs.get(i).copied().unwrap_or(f64::NAN);
        eprintln!(
            "[{label}] chunk {:>2}: running PPL combs {ppl:.4}, llama.cpp {want:.4} ({:+.3}%), {:.0} s",
            i + 1,
            100.0 * (ppl / want - 1.0),
            t0.elapsed().as_secs_f64()
        );
    })
    .expect("perplexity")
}

/// Relative difference in percent.
pub fn rel_pct(ours: f64, theirs: f64) -> f64 {
    100.0 * (ours / theirs - 1.0)
}

// ---------------------------------------------------------------- the three checks

/// The first `n` rows of a window, as rows for [`check_teacher`].
pub fn first(n: usize) -> Vec<Range<usize>> {
    std::iter::once(0..n).collect()
}

/// `0..128`, `0..32+512..544`.
fn fmt_rows(rows: &[Range<usize>]) -> String {
    rows.iter()
        .map(|r| format!("{}..{}", r.start, r.end))
        .collect::<Vec<_>>()
        .join("+")
}

/// Teacher forcing on the given rows of each named window: combs' argmax
/// must agree with llama.cpp's as closely as the exact f64 forward's does (2
/// points of slack) or at ≥ 99% of the positions, and (where the fixture has
/// the f64 reference forward) with the reference's at ≥ 99%.
pub fn check_teacher(c: &Case, windows: &[(&str, &[Range<usize>])]) {
    let mut session = c.session();
    let mut failed = Vec::new();
    let (mut agree, mut total, mut max_diff) = (0, 0, 0.0f64);
    for &(w, rows) in windows {
        let tokens = ids(field(field(c.inputs, "windows"), w));
        let want = TopK::from_json(field(field(&c.fixture, "teacher"), w));
        let t0 = std::time::Instant::now();
        let dump = format!("{}-{w}-{}", c.dump_prefix, fmt_rows(rows));
        let r = teacher_forcing(&mut session, &tokens, &want, rows, &dump);
        let label = format!("{} teacher {w} {}", c.label, fmt_rows(rows));
        print_teacher(&label, &r, &tokens, |t| c.piece(t));
        eprintln!("[{label}] {:.0} s", t0.elapsed().as_secs_f64());
        agree += r.llama.agree;
        total += r.n;
        max_diff = max_diff.max(r.llama.max_abs_diff);
        // llama.cpp's CPU backend rounds activations to 8 bits before every
        // quantized product, and its two attention paths disagree with each
        // other at several percent of the positions of these texts (the
        // fixture's flash-attn on/off baseline), so ≥ 99% with llama.cpp is
        // out of reach of any exact forward pass: combs must agree with
        // llama.cpp at least as well as the exact f64 forward does (2 points
        // of slack), and with that forward at ≥ 99% (below).
        let floor = r
            .ref_llama_agree
            .map_or(0.99 * r.n as f64, |a| a as f64 - 0.02 * r.n as f64);
        if !r.meets_99pct() && (r.llama.agree as f64) < floor {
            let base = |a: Option<usize>| {
                a.map_or("-".to_string(), |a| {
                    format!("{:.2}%", 100.0 * a as f64 / r.n as f64)
                })
            };
            failed.push(format!(
                "{w}: {:.2}% agreement with llama.cpp (baselines: the f64 reference agrees with \
                 llama.cpp at {}, llama.cpp flash-attn off with on at {})",
                r.agreement_pct(),
                base(r.ref_llama_agree),
                base(r.fa_off_agree)
            ));
        }
        if let Some(d) = r.reference.as_ref().filter(|d| !meets_99pct(d.agree, r.n)) {
            failed.push(format!(
                "{w}: {}/{} agreement with the f64 reference",
                d.agree, r.n
            ));
        }
    }
    eprintln!(
        "RESULT {} teacher: {agree}/{total} = {:.2}% argmax agreement with llama.cpp, \
         max |logit diff| {max_diff:.4}",
        c.label,
        100.0 * agree as f64 / total.max(1) as f64
    );
    assert!(failed.is_empty(), "{}: {failed:?}", c.label);
}

/// Greedy generation of `n_gen` tokens from each named prompt (all when
/// `names` is empty); the first `n_exact` must equal the f64 reference
/// forward's, and llama.cpp's as far as that forward's equal llama.cpp's.
/// The prompts are made as a user would make them (the chat template where
/// the fixture has messages, the tokenizer) and must give llama.cpp's tokens.
pub fn check_greedy(c: &Case, names: &[&str], n_gen: usize, n_exact: usize) {
    let mut session = c.session();
    let tok = c.model.tokenizer();
    let mut failed = Vec::new();
    let mut matched = Vec::new();
    for p in field(c.inputs, "prompts").as_array().expect("prompts") {
        let name = field(p, "name").as_str().expect("name");
        if !names.is_empty() && !names.contains(&name) {
            continue;
        }
        let text = field(p, "text").as_str().expect("text");
        let prompt = ids(field(p, "tokens"));
        let chat = p.get("messages");
        // the prompt as a user would make it: template (for the chat one) and tokenizer
        if let Some(msgs) = chat {
            let msgs: Vec<ChatMessage> = msgs
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| {
                    ChatMessage::new(
                        field(m, "role").as_str().expect("role"),
                        field(m, "content").as_str().expect("content"),
                    )
                })
                .collect();
            let rendered = tok.apply_chat_template(&msgs, true).expect("chat template");
            if rendered != text {
                failed.push(format!(
                    "{name}: chat template renders {rendered:?}, llama.cpp's input is {text:?}"
                ));
            }
        }
        // control tokens written in the text are parsed for chat turns
        let special = p
            .get("parse_special")
            .and_then(Value::as_bool)
            .unwrap_or(chat.is_some());
        let ours_prompt = tok.encode(text, true, special).expect("encode");
        if ours_prompt != prompt {
            failed.push(format!(
                "{name}: combs tokenizes the prompt as {ours_prompt:?}, llama.cpp as {prompt:?}"
            ));
        }
        let theirs = ids(field(field(&c.fixture, "greedy"), name));
        let t0 = std::time::Instant::now();
        let r = greedy(&mut session, &prompt, n_gen, &theirs);
        let label = format!("{} greedy {name}", c.label);
        eprintln!(
            "[{label}] {}/{} tokens equal before the first difference ({} prompt tokens, {:.0} s)",
            r.n_match,
            r.ours.len(),
            prompt.len(),
            t0.elapsed().as_secs_f64()
        );
        if r.n_match < r.ours.len() {
            let k = r.n_match;
            eprintln!(
                "[{label}]   at token {k}: combs {} {:?} (its top-2 margin {:.4}), llama.cpp {} {:?}",
                r.ours[k],
                c.piece(r.ours[k]),
                r.margins[k],
                r.theirs[k],
                c.piece(r.theirs[k])
            );
            eprintln!("[{label}]   combs:     {:?}", c.text(&r.ours));
            eprintln!("[{label}]   llama.cpp: {:?}", c.text(&r.theirs));
        } else {
            eprintln!("[{label}]   {:?}", c.text(&r.ours));
        }
        // baselines: the same greedy run by llama.cpp with flash attention
        // off and by the f64 reference forward
        let n = r.ours.len();
        for (key, what) in [
            ("greedy_fa_off", "llama.cpp flash-attn off"),
            ("greedy_ref", "the f64 reference"),
        ] {
            if let Some(other) = c.fixture.get(key).and_then(|g| g.get(name)) {
                let other = ids(other);
                eprintln!(
                    "[{label}]   baseline: {what} equals llama.cpp for {}/{n} tokens, combs for {}/{n}",
                    common_prefix(&other[..n], &theirs[..n]),
                    common_prefix(&other[..n], &r.ours),
                );
            }
        }
        matched.push(format!("{name} {}/{}", r.n_match, r.ours.len()));
        // Exact agreement with llama.cpp is required up to where the exact
        // f64 forward itself still agrees with llama.cpp; combs must equal
        // the f64 forward's greedy tokens for the first n_exact.
        let need = match c.fixture.get("greedy_ref").and_then(|g| g.get(name)) {
            Some(reference) => {
                let reference = ids(reference);
                let with_ref = common_prefix(&reference[..n], &r.ours);
                if with_ref < n_exact.min(n) {
                    failed.push(format!(
                        "{name}: differs from the f64 reference forward at token {with_ref} \
                         (need {n_exact} equal)"
                    ));
                }
                common_prefix(&reference[..n], &theirs[..n]).min(n_exact)
            }
            None => n_exact,
        };
        if r.n_match < need.min(n) {
            failed.push(format!(
                "{name}: first difference from llama.cpp at token {} (need {need} equal)",
                r.n_match
            ));
        }
    }
    eprintln!("RESULT {} greedy: {}", c.label, matched.join(", "));
    assert!(failed.is_empty(), "{}: {failed:#?}", c.label);
}

/// Perplexity on GPL-3 over the first `n_chunks` chunks of 512 (all when
/// `None`; at least 2, as for `combs perplexity`) within 1% of llama.cpp's
/// running value after as many chunks, and (where the fixture has the f64
/// reference forward's perplexity) within 0.1% of that one. The text is
/// tokenized the way `combs perplexity` does it, and must give llama.cpp's
/// tokens.
pub fn check_perplexity(c: &Case, n_chunks: Option<usize>) {
    let src = field(field(c.inputs, "texts"), "gpl3");
    let path = PathBuf::from(field(src, "path").as_str().expect("path"));
    let text = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (Debian package base-files)", path.display()));
    check_same_file(
        &path,
        field(src, "sha256").as_str().expect("sha256"),
        "another version of the text",
    );
    let tok = c.model.tokenizer();
    let tokens = tok
        .encode(&String::from_utf8_lossy(&text), true, false)
        .expect("encode");
    let theirs_tokens = ids(field(field(c.inputs, "perplexity_tokens"), "tokens"));
    if tokens != theirs_tokens {
        let k = common_prefix(&tokens, &theirs_tokens);
        panic!(
            "combs tokenizes {} differently from llama.cpp: {} vs {} tokens, first difference at {k}",
            path.display(),
            tokens.len(),
            theirs_tokens.len()
        );
    }
    let ppl = field(&c.fixture, "perplexity");
    let per_chunk = floats(field(ppl, "per_chunk"));
    let n = n_chunks.unwrap_or(tokens.len() / 512);
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let mut session = c.session();
    let label = format!("{} perplexity", c.label);
    let r = perplexity_chunks(&label, &mut session, &tokens, bos, n, &per_chunk);
    let theirs = if n == per_chunk.len() {
        field(ppl, "ppl").as_f64().expect("ppl")
    } else {
        per_chunk[n - 1]
    };
    let d = rel_pct(r.ppl, theirs);
    if let Some(off) = ppl.get("fa_off") {
        let off_chunks = floats(field(off, "per_chunk"));
        let o = off_chunks[n - 1];
        eprintln!(
            "[{label}] baseline: llama.cpp flash-attn off {o:.4} ({:+.3}% from flash-attn on)",
            rel_pct(o, theirs)
        );
    }
    // the exact forward's value: how far llama.cpp's own numerics move it
    let reference = ppl.get("ref").map(|f| floats(field(f, "per_chunk"))[n - 1]);
    if let Some(x) = reference {
        eprintln!(
            "[{label}] baseline: f64 reference {x:.4} ({:+.3}% from llama.cpp), combs {:+.4}% from it",
            rel_pct(x, theirs),
            rel_pct(r.ppl, x)
        );
    }
    eprintln!(
        "RESULT {} perplexity ({n} chunks): combs {:.4} +/- {:.5}, llama.cpp {theirs:.4}, {d:+.3}%",
        c.label, r.ppl, r.ppl_err
    );
    assert!(
        d.abs() <= 1.0,
        "{}: PPL {:.4} is {d:+.3}% from llama.cpp's {theirs:.4}",
        c.label,
        r.ppl
    );
    if let Some(x) = reference {
        assert!(
            rel_pct(r.ppl, x).abs() <= 0.1,
            "{}: PPL {:.4} is {:+.3}% from the f64 reference forward's {x:.4}",
            c.label,
            r.ppl,
            rel_pct(r.ppl, x)
        );
    }
}
