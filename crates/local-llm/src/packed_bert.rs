//! A BERT encoder (all-MiniLM-L6-v2's architecture) that runs a batch of
//! inputs packed end to end, without padding: the dense layers see one
//! `[tokens, hidden]` matrix holding only real tokens, and attention is
//! computed per input over its own tokens, so no work is spent on padding and
//! no attention mask is needed. Mean pooling happens per input as well.
//!
//! Equivalent to `candle_transformers::models::bert::BertModel` with an
//! attention mask followed by mean pooling (the test
//! `packed_embeddings_match_the_padded_model` holds them together), but a
//! batch of mixed lengths costs what its tokens cost instead of
//! `inputs × longest`.

use candle_core::{CpuStorage, CustomOp2, Device, Layout, Shape, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{Config as BertConfig, HiddenAct};

pub struct PackedBert {
    word_embeddings: Tensor,
    position_embeddings: Tensor,
    token_type_embedding: Tensor,
    embeddings_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    hidden: usize,
    max_positions: usize,
    device: Device,
}

struct Norm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
}

impl Norm {
    fn load(vb: VarBuilder, size: usize, eps: f64) -> candle_core::Result<Self> {
        Ok(Self {
            weight: vb.get(size, "weight")?,
            bias: vb.get(size, "bias")?,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::layer_norm(x, &self.weight, &self.bias, self.eps)
    }
}

/// A dense layer with its weight stored transposed (`[in, out]`, contiguous),
/// so the packed `[tokens, in]` input multiplies it directly.
struct Dense {
    weight_t: Tensor,
    bias: Tensor,
}

impl Dense {
    fn load(vb: VarBuilder, input: usize, output: usize) -> candle_core::Result<Self> {
        let weight = vb.get((output, input), "weight")?;
        Ok(Self {
            weight_t: weight.t()?.contiguous()?,
            bias: vb.get(output, "bias")?,
        })
    }

    /// Query, key and value as one `[in, 3 × out]` layer: one matrix product
    /// instead of three.
    fn fused(parts: &[Dense]) -> candle_core::Result<Self> {
        let weights: Vec<&Tensor> = parts.iter().map(|d| &d.weight_t).collect();
        let biases: Vec<&Tensor> = parts.iter().map(|d| &d.bias).collect();
        Ok(Self {
            weight_t: Tensor::cat(&weights, 1)?.contiguous()?,
            bias: Tensor::cat(&biases, 0)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.matmul(&self.weight_t)?.broadcast_add(&self.bias)
    }

    /// `gelu(x · W + b)` with the bias and activation in one parallel pass.
    fn forward_gelu(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.matmul(&self.weight_t)?
            .apply_op2_no_bwd(&self.bias, &BiasGeluErf)
    }
}

struct Layer {
    qkv: Dense,
    attention_out: Dense,
    attention_norm: Norm,
    intermediate: Dense,
    output: Dense,
    output_norm: Norm,
}

impl PackedBert {
    pub fn load(vb: VarBuilder, config: &BertConfig) -> candle_core::Result<Self> {
        if !matches!(config.hidden_act, HiddenAct::Gelu) {
            candle_core::bail!("only the exact (erf) GELU activation is supported");
        }
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        let hidden = config.hidden_size;
        let heads = config.num_attention_heads;
        if heads == 0 || !hidden.is_multiple_of(heads) {
            candle_core::bail!("hidden size {hidden} does not split into {heads} heads");
        }
        let emb = vb.pp("embeddings");
        let word_embeddings = emb.get((config.vocab_size, hidden), "word_embeddings.weight")?;
        let position_embeddings = emb.get(
            (config.max_position_embeddings, hidden),
            "position_embeddings.weight",
        )?;
        // Every input is one segment: token type 0 throughout.
        let token_type_embedding = emb
            .get(
                (config.type_vocab_size, hidden),
                "token_type_embeddings.weight",
            )?
            .get(0)?;
        let embeddings_norm = Norm::load(emb.pp("LayerNorm"), hidden, config.layer_norm_eps)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for index in 0..config.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{index}"));
            let attention = l.pp("attention");
            let qkv = Dense::fused(&[
                Dense::load(attention.pp("self.query"), hidden, hidden)?,
                Dense::load(attention.pp("self.key"), hidden, hidden)?,
                Dense::load(attention.pp("self.value"), hidden, hidden)?,
            ])?;
            layers.push(Layer {
                qkv,
                attention_out: Dense::load(attention.pp("output.dense"), hidden, hidden)?,
                attention_norm: Norm::load(
                    attention.pp("output.LayerNorm"),
                    hidden,
                    config.layer_norm_eps,
                )?,
                intermediate: Dense::load(
                    l.pp("intermediate.dense"),
                    hidden,
                    config.intermediate_size,
                )?,
                output: Dense::load(l.pp("output.dense"), config.intermediate_size, hidden)?,
                output_norm: Norm::load(l.pp("output.LayerNorm"), hidden, config.layer_norm_eps)?,
            });
        }
        Ok(Self {
            word_embeddings,
            position_embeddings,
            token_type_embedding,
            embeddings_norm,
            layers,
            heads,
            head_dim: hidden / heads,
            hidden,
            max_positions: config.max_position_embeddings,
            device: vb.device().clone(),
        })
    }

    /// Mean-pooled (not yet normalised) hidden states, one row per input.
    /// Each input is its token ids, `[CLS]`/`[SEP]` included.
    pub fn forward_pooled(&self, inputs: &[&[u32]]) -> candle_core::Result<Tensor> {
        let total: usize = inputs.iter().map(|ids| ids.len()).sum();
        if inputs.iter().any(|ids| ids.is_empty()) {
            candle_core::bail!("an input has no tokens");
        }
        if let Some(long) = inputs.iter().find(|ids| ids.len() > self.max_positions) {
            candle_core::bail!(
                "an input has {} tokens, more than the model's {} positions",
                long.len(),
                self.max_positions
            );
        }
        let mut ids = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        for input in inputs {
            ids.extend_from_slice(input);
            positions.extend(0..input.len() as u32);
        }
        let ids = Tensor::from_vec(ids, total, &self.device)?;
        let positions = Tensor::from_vec(positions, total, &self.device)?;
        let x = (self.word_embeddings.index_select(&ids, 0)?
            + self.position_embeddings.index_select(&positions, 0)?)?
        .broadcast_add(&self.token_type_embedding)?;
        let mut x = self.embeddings_norm.forward(&x)?;
        let lengths: Vec<usize> = inputs.iter().map(|ids| ids.len()).collect();
        for layer in &self.layers {
            x = self.layer(layer, &x, &lengths)?;
        }
        let mut pooled = Vec::with_capacity(inputs.len());
        let mut offset = 0;
        for &len in &lengths {
            pooled.push(x.narrow(0, offset, len)?.mean(0)?);
            offset += len;
        }
        Tensor::stack(&pooled, 0)
    }

    fn layer(&self, layer: &Layer, x: &Tensor, lengths: &[usize]) -> candle_core::Result<Tensor> {
        let qkv = layer.qkv.forward(x)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let mut contexts = Vec::with_capacity(lengths.len());
        let mut offset = 0;
        for &len in lengths {
            // [len, 3 × hidden] → [3, heads, len, head_dim]
            let part = qkv
                .narrow(0, offset, len)?
                .reshape((len, 3, self.heads, self.head_dim))?
                .permute((1, 2, 0, 3))?
                .contiguous()?;
            let q = part.get(0)?;
            let k = part.get(1)?;
            let v = part.get(2)?;
            let scores = (q.matmul(&k.t()?)? * scale)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let context = probs
                .matmul(&v)?
                .transpose(0, 1)?
                .reshape((len, self.hidden))?;
            contexts.push(context);
            offset += len;
        }
        let context = Tensor::cat(&contexts, 0)?;
        let attended = layer
            .attention_norm
            .forward(&(layer.attention_out.forward(&context)? + x)?)?;
        let intermediate = layer.intermediate.forward_gelu(&attended)?;
        layer
            .output_norm
            .forward(&(layer.output.forward(&intermediate)? + &attended)?)
    }
}

/// `gelu_erf(x + bias)` over a `[rows, cols]` matrix and a `[cols]` bias,
/// split across the CPU's threads (candle's own unary and binary ops run on
/// one thread, which made the activation a large share of the forward pass).
struct BiasGeluErf;

impl CustomOp2 for BiasGeluErf {
    fn name(&self) -> &'static str {
        "bias-gelu-erf"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(bias)) = (s1, s2) else {
            candle_core::bail!("bias-gelu-erf needs f32 tensors");
        };
        let (Some((x_start, x_end)), Some((b_start, b_end))) =
            (l1.contiguous_offsets(), l2.contiguous_offsets())
        else {
            candle_core::bail!("bias-gelu-erf needs contiguous tensors");
        };
        let x = &x[x_start..x_end];
        let bias = &bias[b_start..b_end];
        let cols = bias.len();
        if cols == 0 || l1.dims().last() != Some(&cols) {
            candle_core::bail!("bias-gelu-erf: bias does not match the last dimension");
        }
        let mut out = vec![0f32; x.len()];
        let rows = x.len() / cols;
        let threads = candle_core::utils::get_num_threads().clamp(1, rows.max(1));
        let rows_per_thread = rows.div_ceil(threads);
        let chunk = rows_per_thread * cols;
        std::thread::scope(|scope| {
            for (src, dst) in x.chunks(chunk).zip(out.chunks_mut(chunk)) {
                scope.spawn(move || {
                    for (src_row, dst_row) in src.chunks(cols).zip(dst.chunks_mut(cols)) {
                        for ((d, s), b) in dst_row.iter_mut().zip(src_row).zip(bias) {
                            let v = s + b;
                            *d = 0.5 * v * (1.0 + libm_erf(v * std::f32::consts::FRAC_1_SQRT_2));
                        }
                    }
                });
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// The error function as candle computes it for `gelu_erf`, so the
/// activation is bit-for-bit the one of the reference model.
fn libm_erf(x: f32) -> f32 {
    candle_core::cpu::erf::erf_f32(x)
}

#[cfg(test)]
mod tests {
    use candle_core::D;

    use super::*;

    #[test]
    fn bias_gelu_matches_candle_ops() -> candle_core::Result<()> {
        let device = Device::Cpu;
        let x = Tensor::arange(0f32, 60.0, &device)?
            .affine(0.1, -3.0)?
            .reshape((6, 10))?;
        let bias = Tensor::arange(0f32, 10.0, &device)?.affine(0.05, -0.2)?;
        let want = x.broadcast_add(&bias)?.gelu_erf()?;
        let got = x.apply_op2_no_bwd(&bias, &BiasGeluErf)?;
        let diff = (want - got)?.abs()?.max_keepdim(D::Minus1)?.max(0)?;
        assert!(diff.to_vec1::<f32>()?[0] < 1e-6);
        Ok(())
    }
}
