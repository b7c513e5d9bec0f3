//! `ModelRegistry`: maps an architecture name (`general.architecture` in
//! GGUF, `model_type` / class names of `config.json`, and common aliases) to
//! the family and loader that runs it.

use std::ops::Range;
use std::sync::Arc;

use super::llama::LlamaModel;
use super::spec::{ArchSpec, Family};
use super::split::{Placement, SplitMode, SplitModel};
use super::{GenerativeModel, Loaded};
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::hf::{HfDir, is_hf_dir};
use crate::gpu::{DeviceClass, GpuContext};
use crate::ops::plan::{Backend, Fusion, IntDot, Planner};
use crate::quant::quantized_linear::LoadQuant;
use std::path::Path;

/// Loads a generative model of a known family from a GGUF file.
pub type Loader =
    fn(&Arc<GpuContext>, &GgufFile, ArchSpec, &LoadOptions) -> Result<Arc<dyn GenerativeModel>>;

/// Options that apply while loading weights.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Show a progress bar on a terminal.
    pub show_progress: bool,
    /// How linear layers round their inputs (exact, or as llama.cpp's CPU backend).
    pub numerics: crate::ops::act_round::Numerics,
    /// Whether the planner folds steps into each other's kernels
    /// (`COMBS_DISABLE_FUSION=1` in the environment turns it off too).
    pub fusion: Fusion,
    /// Plan kernels as for this class of device (`None`: the device's own;
    /// see [`Planner::plan_as`]).
    pub plan_as: Option<DeviceClass>,
    /// Record with these kernels (`None`: native on CPU devices, Vulkan
    /// elsewhere; see [`Planner::backend`]).
    pub backend: Option<Backend>,
    /// Convert the weights while loading (`--quant`): Q4_1 matrices, or
    /// all matrices in f16 / bf16 (`None`: as stored).
    pub quant: Option<LoadQuant>,
    /// Whether decode products of Q4_0 / Q8_0 weights take the integer
    /// path under llama.cpp numerics (see [`IntDot`]).
    pub int_dot: IntDot,
    /// How [`ModelRegistry::load_on`] uses several devices.
    pub split_mode: SplitMode,
    /// Each device's share of the blocks under [`SplitMode::Layer`], in
    /// device order (llama.cpp's `--tensor-split`; empty: by each
    /// device's free memory).
    pub tensor_split: Vec<f32>,
    /// Which device a new session goes to under [`SplitMode::Replica`].
    pub placement: Placement,
    /// Load only these blocks (one device's share of a split; `None`: all).
    pub layers: Option<Range<usize>>,
}

impl LoadOptions {
    /// The planner's settings these options ask for.
    pub fn planner(&self) -> Planner {
        Planner {
            numerics: self.numerics,
            fusion: match Fusion::from_env() {
                Fusion::Off => Fusion::Off,
                Fusion::On => self.fusion,
            },
            plan_as: self.plan_as,
            backend: self.backend,
            int_dot: self.int_dot,
        }
    }

    /// [`Self::planner`], checked against the device the model loads on.
    ///
    /// # Errors
    /// The host's kernels asked for on a device whose buffers the host
    /// cannot reach (any but a CPU device).
    pub fn planner_for(&self, ctx: &GpuContext) -> Result<Planner> {
        if self.backend == Some(Backend::Host) && ctx.caps().class() != DeviceClass::Cpu {
            return Err(ModelError::invalid(
                "kernels",
                format!(
                    "the host's kernels run on CPU devices only, not on {}",
                    ctx.caps().name
                ),
            ));
        }
        Ok(self.planner())
    }
}

/// One registered architecture.
pub struct Registration {
    /// Names that select it (lower case).
    pub names: &'static [&'static str],
    /// The family it resolves to.
    pub family: Family,
    /// Its loader.
    pub loader: Loader,
}

fn load_llama(
    ctx: &Arc<GpuContext>,
    g: &GgufFile,
    spec: ArchSpec,
    opts: &LoadOptions,
) -> Result<Arc<dyn GenerativeModel>> {
    let planner = opts.planner_for(ctx)?;
    let layers = opts.layers.clone().unwrap_or(0..spec.n_layer);
    let arch = LlamaModel::load_layers(ctx, g, spec, opts, layers)?;
    Ok(Arc::new(Loaded::new(arch, planner)))
}

/// Every architecture combs runs: resolves a file's architecture name
/// into an [`ArchSpec`] and loads it as a [`GenerativeModel`].
///
/// ```
/// # use combs::formats::gguf::GgufFile;
/// # use combs::models::synth::{SynthConfig, synth_gguf};
/// # use combs::quant::QuantType;
/// use combs::gpu::GpuContext;
/// use combs::{GenerativeModel, LoadOptions, ModelRegistry};
///
/// fn main() -> combs::Result<()> {
///     let registry = ModelRegistry::new();
///     assert!(registry.lookup("Qwen2ForCausalLM").is_some());
///     let ctx = GpuContext::new(None)?;
///     # let tiny = SynthConfig::preset("tiny", QuantType::Q8_0)?;
///     # let gguf = GgufFile::from_bytes(synth_gguf(&tiny)?.to_bytes())?;
///     let model = registry.load(&ctx, &gguf, &LoadOptions::default())?;
///     assert_eq!(model.spec().arch, "llama");
///     Ok(())
/// }
/// ```
pub struct ModelRegistry {
    entries: Vec<Registration>,
}

impl Default for ModelRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl ModelRegistry {
    /// The built-in registry.
    pub fn new() -> Self {
        let entries = vec![
            Registration {
                names: &[
                    "llama",
                    "smollm",
                    "smollm2",
                    "llamaforcausallm",
                    "tinyllama",
                ],
                family: Family::Llama,
                loader: load_llama,
            },
            Registration {
                names: &["mistral", "mistralforcausallm"],
                family: Family::Mistral,
                loader: load_llama,
            },
            Registration {
                names: &["qwen2", "qwen2forcausallm", "qwen2.5"],
                family: Family::Qwen2,
                loader: load_llama,
            },
            Registration {
                names: &["qwen3", "qwen3forcausallm"],
                family: Family::Qwen3,
                loader: load_llama,
            },
            Registration {
                names: &[
                    "gemma3",
                    "gemma3_text",
                    "gemma3forcausallm",
                    "gemma3forconditionalgeneration",
                ],
                family: Family::Gemma3,
                loader: load_llama,
            },
            Registration {
                names: &["phi3", "phi3forcausallm", "phi-3"],
                family: Family::Phi3,
                loader: load_llama,
            },
        ];
        ModelRegistry { entries }
    }

    /// The registration for `name`, case-insensitively.
    pub fn lookup(&self, name: &str) -> Option<&Registration> {
        let lower = name.to_ascii_lowercase();
        self.entries
            .iter()
            .find(|r| r.names.iter().any(|n| *n == lower))
    }

    /// The family of a Hugging Face directory: `config.json::model_type`,
    /// else its first `architectures` class name.
    ///
    /// # Errors
    /// `UnsupportedArchitecture` naming the type; a multimodal config
    /// (`text_config` inside) is refused with a hint.
    pub fn resolve_hf(&self, dir: &HfDir) -> Result<Family> {
        let mt = dir.model_type()?;
        if dir.config().get("text_config").is_some() {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "{mt} (a multimodal config.json with a text_config; only text-only \
                 directories such as gemma3_text load)"
            )));
        }
        let arch = dir
            .config()
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str());
        self.lookup(mt)
            .or_else(|| arch.and_then(|a| self.lookup(a)))
            .map(|r| r.family)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(mt.to_string()))
    }

    /// Opens a model file as GGUF: a GGUF file as it is, a Hugging Face
    /// directory as its converted GGUF (see [`crate::models::hf`]); then
    /// converts its weights as `opts.quant` asks.
    ///
    /// # Errors
    /// I/O and format errors, an unsupported architecture or tokenizer,
    /// tensors that disagree with config.json.
    pub fn open(&self, path: &Path, opts: &LoadOptions) -> Result<GgufFile> {
        let g = if is_hf_dir(path) {
            let dir = HfDir::open(path)?;
            let family = self.resolve_hf(&dir)?;
            crate::models::hf::to_gguf(&dir, family)?
        } else if path.is_dir() {
            return Err(ModelError::Io {
                path: path.join(crate::formats::hf::CONFIG_FILE),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "a model directory needs config.json (Hugging Face layout)",
                ),
            });
        } else {
            GgufFile::open(path)?
        };
        match opts.quant {
            Some(q) => q.apply(&g),
            None => Ok(g),
        }
    }

    /// Resolves the file's architecture into an [`ArchSpec`].
    ///
    /// # Errors
    /// `UnsupportedArchitecture` naming the architecture, or bad metadata.
    pub fn resolve(&self, g: &GgufFile) -> Result<ArchSpec> {
        let arch = g.architecture()?;
        let reg = self
            .lookup(arch)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(arch.to_string()))?;
        ArchSpec::from_gguf(g, reg.family)
    }

    /// Resolves and loads a generative model.
    ///
    /// # Errors
    /// As [`ModelRegistry::resolve`], plus missing tensors and device errors.
    pub fn load(
        &self,
        ctx: &Arc<GpuContext>,
        g: &GgufFile,
        opts: &LoadOptions,
    ) -> Result<Arc<dyn GenerativeModel>> {
        let arch = g.architecture()?;
        let reg = self
            .lookup(arch)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(arch.to_string()))?;
        let spec = ArchSpec::from_gguf(g, reg.family)?;
        (reg.loader)(ctx, g, spec, opts)
    }

    /// Loads a generative model over the devices `ctxs`: on one device as
    /// [`ModelRegistry::load`]; on several, as `opts.split_mode` says — one
    /// [`SplitModel`] over all of them, or one whole model on each
    /// ([`SplitMode::Replica`]). Returns the models sessions run on.
    ///
    /// # Errors
    /// No devices, a split that does not match them, and the errors of
    /// [`ModelRegistry::load`] on each.
    pub fn load_on(
        &self,
        ctxs: &[Arc<GpuContext>],
        g: &GgufFile,
        opts: &LoadOptions,
    ) -> Result<Vec<Arc<dyn GenerativeModel>>> {
        match (ctxs, opts.split_mode) {
            ([], _) => Err(ModelError::invalid("devices", "no device to load on")),
            ([ctx], _) => Ok(vec![self.load(ctx, g, opts)?]),
            (_, SplitMode::Layer) => Ok(vec![Arc::new(SplitModel::load(self, ctxs, g, opts)?)]),
            (_, SplitMode::Replica) => ctxs.iter().map(|c| self.load(c, g, opts)).collect(),
        }
    }
}
