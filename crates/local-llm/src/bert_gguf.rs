//! Writes the bundled BERT embedding model (all-MiniLM-L6-v2 as
//! `model.safetensors` + `config.json`) as a GGUF file that llama.cpp's
//! `bert` architecture loads. The dense layers' weights are f16, bf16 (all of
//! them, the fused query/key/value ones included), or, with
//! [`DenseWeights::Q8`], the attention-output and feed-forward ones in Q8_0
//! (blocks of 32 int8 values sharing one f16 scale, multiplied with int8 dot
//! products) and the fused query/key/value ones in f16. Embeddings, norms and
//! biases stay f32. [`DenseWeights::for_this_cpu`] picks bf16 where the CPU
//! code has AVX-512 BF16 (1.3-1.4x f16 there), f16 elsewhere; Q8_0 was no
//! faster than f16 with either the AVX2 or the AVX-512 VNNI kernels and is
//! less exact (cosine 0.9993 against the f32 vectors, against 0.99999).
//!
//! Only what llama.cpp needs to run the encoder is written: the tokenizer
//! stays the `tokenizers` crate's (the GGUF declares no vocabulary and the
//! server feeds token ids), so word pieces are exactly those of the candle
//! path.
//!
//! The format (GGUF v3): magic, version, tensor and key/value counts; the
//! key/values; per tensor its name, dimensions (innermost first), type and
//! data offset; then the tensor data, each aligned to [`ALIGNMENT`] bytes.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::bert::{Config as BertConfig, HiddenAct};

const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;
/// llama.cpp's default `general.alignment`.
const ALIGNMENT: usize = 32;

/// Values per Q8_0 block.
const Q8_BLOCK: usize = 32;

// GGUF metadata value types.
const TYPE_UINT32: u32 = 4;
const TYPE_FLOAT32: u32 = 6;
const TYPE_BOOL: u32 = 7;
const TYPE_STRING: u32 = 8;

// ggml tensor types.
const GGML_F32: u32 = 0;
const GGML_F16: u32 = 1;
const GGML_Q8_0: u32 = 8;
const GGML_BF16: u32 = 30;

/// llama.cpp's `LLAMA_POOLING_TYPE_MEAN`.
const POOLING_MEAN: u32 = 1;

/// How the dense layers' weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseWeights {
    F16,
    Q8,
    /// bfloat16: the range of f32 with 8 bits of mantissa; AVX-512 BF16
    /// multiplies pairs of them in one instruction.
    Bf16,
}

impl DenseWeights {
    /// bf16 where the llama.cpp CPU code loaded multiplies it natively
    /// (AVX-512 BF16: 1.3-1.4x f16's speed here, cosine still >= 0.999),
    /// f16 elsewhere (where bf16 is only widened to f32 and gains nothing).
    pub fn for_this_cpu() -> Self {
        let native_bf16 = crate::engine::cpu_variant()
            .ok()
            .and_then(|loaded| crate::cpu_variant::variant(loaded.name))
            .is_some_and(|v| {
                v.requires
                    .contains(&crate::cpu_variant::Feature::Avx512Bf16)
            });
        if native_bf16 { Self::Bf16 } else { Self::F16 }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Q8 => "q8",
            Self::Bf16 => "bf16",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("reading the model: {0}")]
    Read(String),
    #[error("the model does not fit llama.cpp's BERT: {0}")]
    Unsupported(String),
    #[error("writing {path}: {reason}")]
    Write { path: String, reason: String },
}

enum Value {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
}

/// One tensor as it goes into the file: its ggml dimensions (innermost
/// first), type and encoded bytes.
struct TensorData {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    bytes: Vec<u8>,
}

/// Converts `dir/model.safetensors` (with `dir/config.json`) into a GGUF at
/// `out`, its dense weights as asked.
pub fn write_bert_gguf(dir: &Path, out: &Path, dense: DenseWeights) -> Result<(), GgufError> {
    let read = |e: &dyn std::fmt::Display| GgufError::Read(e.to_string());
    let config_text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| read(&e))?;
    let config: BertConfig = serde_json::from_str(&config_text).map_err(|e| read(&e))?;
    if !matches!(config.hidden_act, HiddenAct::Gelu) {
        return Err(GgufError::Unsupported(
            "only the GELU activation is supported".to_owned(),
        ));
    }
    if !config.hidden_size.is_multiple_of(Q8_BLOCK)
        || !config.intermediate_size.is_multiple_of(Q8_BLOCK)
    {
        return Err(GgufError::Unsupported(format!(
            "hidden ({}) and intermediate ({}) sizes must be multiples of {Q8_BLOCK}",
            config.hidden_size, config.intermediate_size
        )));
    }
    let weights = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
        .map_err(|e| read(&e))?;
    let tensors = bert_tensors(&weights, &config, dense)?;
    let metadata = bert_metadata(&config);
    let bytes = encode_file(&metadata, &tensors);
    let write_err = |e: std::io::Error| GgufError::Write {
        path: out.display().to_string(),
        reason: e.to_string(),
    };
    let mut file = std::fs::File::create(out).map_err(write_err)?;
    file.write_all(&bytes).map_err(write_err)?;
    file.sync_all().map_err(write_err)
}

fn bert_metadata(config: &BertConfig) -> Vec<(String, Value)> {
    let arch = |key: &str| format!("bert.{key}");
    let as_u32 = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    vec![
        ("general.architecture".to_owned(), Value::Str("bert".into())),
        (
            "general.name".to_owned(),
            Value::Str("all-MiniLM-L6-v2".into()),
        ),
        (
            arch("context_length"),
            as_u32(config.max_position_embeddings),
        ),
        (arch("embedding_length"), as_u32(config.hidden_size)),
        (
            arch("feed_forward_length"),
            as_u32(config.intermediate_size),
        ),
        (arch("block_count"), as_u32(config.num_hidden_layers)),
        (
            arch("attention.head_count"),
            as_u32(config.num_attention_heads),
        ),
        (
            arch("attention.layer_norm_epsilon"),
            Value::F32(config.layer_norm_eps as f32),
        ),
        (arch("attention.causal"), Value::Bool(false)),
        (arch("pooling_type"), Value::U32(POOLING_MEAN)),
        (arch("vocab_size"), as_u32(config.vocab_size)),
        // No vocabulary: the server tokenizes and passes ids.
        ("tokenizer.ggml.model".to_owned(), Value::Str("none".into())),
        (
            "tokenizer.ggml.token_type_count".to_owned(),
            as_u32(config.type_vocab_size),
        ),
    ]
}

fn bert_tensors(
    weights: &HashMap<String, Tensor>,
    config: &BertConfig,
    dense: DenseWeights,
) -> Result<Vec<TensorData>, GgufError> {
    let dense_tensor = match dense {
        DenseWeights::F16 => f16_tensor,
        DenseWeights::Q8 => q8_tensor,
        DenseWeights::Bf16 => bf16_tensor,
    };
    // Some exports prefix every name with `bert.`.
    let prefix = if weights.contains_key("bert.embeddings.word_embeddings.weight") {
        "bert."
    } else {
        ""
    };
    let get = |name: &str| -> Result<Tensor, GgufError> {
        let full = format!("{prefix}{name}");
        weights
            .get(&full)
            .ok_or_else(|| GgufError::Unsupported(format!("missing tensor {full}")))?
            .to_dtype(DType::F32)
            .map_err(|e| GgufError::Read(e.to_string()))
    };
    let mut out = vec![
        f32_tensor(
            "token_embd.weight",
            &get("embeddings.word_embeddings.weight")?,
        )?,
        f32_tensor(
            "position_embd.weight",
            &get("embeddings.position_embeddings.weight")?,
        )?,
        f32_tensor(
            "token_types.weight",
            &get("embeddings.token_type_embeddings.weight")?,
        )?,
        f32_tensor(
            "token_embd_norm.weight",
            &get("embeddings.LayerNorm.weight")?,
        )?,
        f32_tensor("token_embd_norm.bias", &get("embeddings.LayerNorm.bias")?)?,
    ];
    let cat = |parts: &[Tensor], dim: usize| {
        Tensor::cat(parts, dim).map_err(|e| GgufError::Read(e.to_string()))
    };
    for index in 0..config.num_hidden_layers {
        let layer = |name: &str| get(&format!("encoder.layer.{index}.{name}"));
        let blk = |name: &str| format!("blk.{index}.{name}");
        // Query, key and value as one fused product.
        let qkv_weight = cat(
            &[
                layer("attention.self.query.weight")?,
                layer("attention.self.key.weight")?,
                layer("attention.self.value.weight")?,
            ],
            0,
        )?;
        let qkv_bias = cat(
            &[
                layer("attention.self.query.bias")?,
                layer("attention.self.key.bias")?,
                layer("attention.self.value.bias")?,
            ],
            0,
        )?;
        // Always f16, never int8: the attention scores amplify the query's
        // and key's rounding, and BERT's layer-norm outputs (this product's
        // input) have outlier dimensions that int8 blocks of 32 resolve
        // poorly. With it in int8 short inputs fell to cosine 0.9989 against
        // the f32 vectors; in f16, 0.9993 and above.
        // bf16 keeps f32's range, so it serves here too.
        let qkv_tensor = match dense {
            DenseWeights::Bf16 => bf16_tensor,
            DenseWeights::F16 | DenseWeights::Q8 => f16_tensor,
        };
        out.push(qkv_tensor(&blk("attn_qkv.weight"), &qkv_weight)?);
        out.push(f32_tensor(&blk("attn_qkv.bias"), &qkv_bias)?);
        out.push(dense_tensor(
            &blk("attn_output.weight"),
            &layer("attention.output.dense.weight")?,
        )?);
        out.push(f32_tensor(
            &blk("attn_output.bias"),
            &layer("attention.output.dense.bias")?,
        )?);
        out.push(f32_tensor(
            &blk("attn_output_norm.weight"),
            &layer("attention.output.LayerNorm.weight")?,
        )?);
        out.push(f32_tensor(
            &blk("attn_output_norm.bias"),
            &layer("attention.output.LayerNorm.bias")?,
        )?);
        out.push(dense_tensor(
            &blk("ffn_up.weight"),
            &layer("intermediate.dense.weight")?,
        )?);
        out.push(f32_tensor(
            &blk("ffn_up.bias"),
            &layer("intermediate.dense.bias")?,
        )?);
        out.push(dense_tensor(
            &blk("ffn_down.weight"),
            &layer("output.dense.weight")?,
        )?);
        out.push(f32_tensor(
            &blk("ffn_down.bias"),
            &layer("output.dense.bias")?,
        )?);
        out.push(f32_tensor(
            &blk("layer_output_norm.weight"),
            &layer("output.LayerNorm.weight")?,
        )?);
        out.push(f32_tensor(
            &blk("layer_output_norm.bias"),
            &layer("output.LayerNorm.bias")?,
        )?);
    }
    Ok(out)
}

/// A tensor's values (row-major) and its ggml dimensions: PyTorch's
/// `[rows, cols]` is ggml's `[cols, rows]`.
fn values_and_dims(tensor: &Tensor) -> Result<(Vec<f32>, Vec<u64>), GgufError> {
    let dims: Vec<u64> = tensor.dims().iter().rev().map(|&d| d as u64).collect();
    let values = tensor
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| GgufError::Read(e.to_string()))?;
    Ok((values, dims))
}

fn f32_tensor(name: &str, tensor: &Tensor) -> Result<TensorData, GgufError> {
    let (values, dims) = values_and_dims(tensor)?;
    Ok(TensorData {
        name: name.to_owned(),
        dims,
        ggml_type: GGML_F32,
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    })
}

fn f16_tensor(name: &str, tensor: &Tensor) -> Result<TensorData, GgufError> {
    two_byte_tensor(name, tensor, GGML_F16, |v| {
        half::f16::from_f32(v).to_le_bytes()
    })
}

fn bf16_tensor(name: &str, tensor: &Tensor) -> Result<TensorData, GgufError> {
    two_byte_tensor(name, tensor, GGML_BF16, |v| {
        half::bf16::from_f32(v).to_le_bytes()
    })
}

/// A tensor of 16-bit floats, each value encoded by `encode`.
fn two_byte_tensor(
    name: &str,
    tensor: &Tensor,
    ggml_type: u32,
    encode: fn(f32) -> [u8; 2],
) -> Result<TensorData, GgufError> {
    let (values, dims) = values_and_dims(tensor)?;
    Ok(TensorData {
        name: name.to_owned(),
        dims,
        ggml_type,
        bytes: values.iter().flat_map(|v| encode(*v)).collect(),
    })
}

fn q8_tensor(name: &str, tensor: &Tensor) -> Result<TensorData, GgufError> {
    let (values, dims) = values_and_dims(tensor)?;
    Ok(TensorData {
        name: name.to_owned(),
        dims,
        ggml_type: GGML_Q8_0,
        bytes: quantize_q8_0(&values),
    })
}

/// ggml's Q8_0: per block of 32 values, the scale `d = max|x| / 127` as f16,
/// then the 32 values as `round(x / d)` in int8.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / Q8_BLOCK * (2 + Q8_BLOCK));
    for block in values.chunks(Q8_BLOCK) {
        let max = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = max / 127.0;
        let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(scale).to_le_bytes());
        out.extend(
            block
                .iter()
                .map(|v| ((v * inverse).round().clamp(-127.0, 127.0) as i8).to_le_bytes()[0]),
        );
    }
    out
}

/// Q8_0 blocks back to f32 (for tests).
pub fn dequantize_q8_0(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(2 + Q8_BLOCK)
        .flat_map(|block| {
            let scale = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            block[2..]
                .iter()
                .map(move |&q| f32::from(i8::from_le_bytes([q])) * scale)
        })
        .collect()
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn pad_to_alignment(out: &mut Vec<u8>) {
    out.resize(out.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
}

fn encode_file(metadata: &[(String, Value)], tensors: &[TensorData]) -> Vec<u8> {
    let data_len: usize = tensors
        .iter()
        .map(|t| t.bytes.len().div_ceil(ALIGNMENT) * ALIGNMENT)
        .sum();
    let mut out = Vec::with_capacity(data_len + 64 * 1024);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut out, key);
        match value {
            Value::U32(v) => {
                out.extend_from_slice(&TYPE_UINT32.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
            Value::F32(v) => {
                out.extend_from_slice(&TYPE_FLOAT32.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
            Value::Bool(v) => {
                out.extend_from_slice(&TYPE_BOOL.to_le_bytes());
                out.push(u8::from(*v));
            }
            Value::Str(v) => {
                out.extend_from_slice(&TYPE_STRING.to_le_bytes());
                put_string(&mut out, v);
            }
        }
    }
    let mut offset = 0usize;
    for tensor in tensors {
        put_string(&mut out, &tensor.name);
        out.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
        for dim in &tensor.dims {
            out.extend_from_slice(&dim.to_le_bytes());
        }
        out.extend_from_slice(&tensor.ggml_type.to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offset += tensor.bytes.len().div_ceil(ALIGNMENT) * ALIGNMENT;
    }
    pad_to_alignment(&mut out);
    for tensor in tensors {
        out.extend_from_slice(&tensor.bytes);
        pad_to_alignment(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_round_trips_within_half_a_step() {
        let values: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.37).sin() * 0.2).collect();
        let bytes = quantize_q8_0(&values);
        assert_eq!(bytes.len(), 2 * 34);
        let back = dequantize_q8_0(&bytes);
        for (block, restored) in values.chunks(32).zip(back.chunks(32)) {
            let step = block.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, b) in block.iter().zip(restored) {
                assert!((a - b).abs() <= step * 0.51, "{a} vs {b}");
            }
        }
        // An all-zero block stays zero (no division by zero).
        assert!(
            dequantize_q8_0(&quantize_q8_0(&[0.0; 32]))
                .iter()
                .all(|v| *v == 0.0)
        );
    }

    #[test]
    fn tensor_offsets_are_aligned_and_data_starts_aligned() {
        let tensors = vec![
            TensorData {
                name: "a".into(),
                dims: vec![3],
                ggml_type: GGML_F32,
                bytes: vec![1; 12],
            },
            TensorData {
                name: "b".into(),
                dims: vec![32],
                ggml_type: GGML_Q8_0,
                bytes: vec![2; 34],
            },
        ];
        let file = encode_file(&[("k".into(), Value::U32(7))], &tensors);
        assert_eq!(&file[..4], MAGIC);
        assert_eq!(file.len() % ALIGNMENT, 0);
        // The last tensor's bytes sit at the end, after alignment padding.
        let b_start = file.len() - 64;
        assert_eq!(&file[b_start..b_start + 34], &[2; 34][..]);
        assert_eq!(&file[b_start - 32..b_start - 20], &[1; 12][..]);
    }
}
