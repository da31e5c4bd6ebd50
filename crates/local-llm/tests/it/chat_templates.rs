//! A GGUF whose own chat template is not ChatML: the server reads it from
//! the file's metadata and renders conversations with it.
//!
//! The file is the bundled model with its `tokenizer.chat_template`
//! replaced, written by a small GGUF (v3) metadata rewriter below: the
//! tensors are copied unchanged, only the key-value section differs.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::common;

use local_llm::chat_template::{ChatMessage, TemplateSource};
use local_llm::engine::{ChatEngine, LlamaEngine};
use local_llm::server::AppState;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Llama-2 style `[INST]` turns: nothing like ChatML.
const INST_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if message['role'] == 'system' %}[INST] <<SYS>>\n{{ message['content'].strip() }}\n<</SYS>> [/INST]\
{% elif message['role'] == 'user' %}[INST] {{ message['content'].strip() }} [/INST]\
{% else %} {{ message['content'].strip() }}{{ eos_token }}{% endif %}{% endfor %}";

const TEMPLATE_KEY: &str = "tokenizer.chat_template";

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let part = &self.bytes[self.at..self.at + n];
        self.at += n;
        part
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8(self.take(n).to_vec()).unwrap()
    }
    /// Skips one value of GGUF type `kind`.
    fn skip_value(&mut self, kind: u32) {
        match kind {
            0 | 1 | 7 => drop(self.take(1)),
            2 | 3 => drop(self.take(2)),
            4..=6 => drop(self.take(4)),
            10..=12 => drop(self.take(8)),
            8 => drop(self.string()),
            9 => {
                let element = self.u32();
                for _ in 0..self.u64() {
                    self.skip_value(element);
                }
            }
            other => panic!("unknown GGUF value type {other}"),
        }
    }
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Copies a GGUF file, setting its chat template.
fn with_chat_template(source: &Path, target: &Path, template: &str) {
    let mut bytes = Vec::new();
    std::fs::File::open(source)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    let mut reader = Reader {
        bytes: &bytes,
        at: 0,
    };
    assert_eq!(reader.take(4), b"GGUF");
    assert_eq!(reader.u32(), 3, "GGUF version");
    let tensors = reader.u64();
    let pairs = reader.u64();
    let mut out = Vec::with_capacity(bytes.len() + template.len());
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&tensors.to_le_bytes());
    let count_at = out.len();
    out.extend_from_slice(&pairs.to_le_bytes());
    let mut alignment = 32u64;
    let mut replaced = false;
    for _ in 0..pairs {
        let start = reader.at;
        let key = reader.string();
        let kind = reader.u32();
        let value_at = reader.at;
        reader.skip_value(kind);
        if key == TEMPLATE_KEY {
            put_string(&mut out, TEMPLATE_KEY);
            out.extend_from_slice(&8u32.to_le_bytes());
            put_string(&mut out, template);
            replaced = true;
            continue;
        }
        if key == "general.alignment" {
            alignment = u64::from(u32::from_le_bytes(
                bytes[value_at..value_at + 4].try_into().unwrap(),
            ));
        }
        out.extend_from_slice(&bytes[start..reader.at]);
    }
    if !replaced {
        put_string(&mut out, TEMPLATE_KEY);
        out.extend_from_slice(&8u32.to_le_bytes());
        put_string(&mut out, template);
        out[count_at..count_at + 8].copy_from_slice(&(pairs + 1).to_le_bytes());
    }
    // Tensor descriptions: offsets are relative to the data section, so
    // they stay valid wherever that section now starts.
    let infos_start = reader.at;
    for _ in 0..tensors {
        reader.string();
        let dims = reader.u32();
        for _ in 0..dims {
            reader.u64();
        }
        reader.u32();
        reader.u64();
    }
    out.extend_from_slice(&bytes[infos_start..reader.at]);
    let align = |n: usize| n.div_ceil(alignment as usize) * alignment as usize;
    out.resize(align(out.len()), 0);
    out.extend_from_slice(&bytes[align(reader.at)..]);
    std::fs::File::create(target)
        .unwrap()
        .write_all(&out)
        .unwrap();
}

/// The bundled model with the `[INST]` template, written once per test binary.
fn inst_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("duo-local-llm-it-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("inst-template.gguf");
        with_chat_template(
            &common::test_config().chat_model_path,
            &target,
            INST_TEMPLATE,
        );
        target
    })
    .clone()
}

fn conversation() -> Vec<ChatMessage> {
    [
        ("system", "Be brief."),
        ("user", " What is Git? "),
        ("assistant", "A version control system."),
        ("user", "Who wrote it?"),
    ]
    .iter()
    .map(|(role, content)| ChatMessage {
        role: (*role).into(),
        content: (*content).into(),
    })
    .collect()
}

#[actix_web::test]
async fn a_gguf_with_a_non_chatml_template_is_spoken_to_in_its_own_format() {
    let path = inst_model();
    let engine = LlamaEngine::load(&path, 1, 1024).expect("the rewritten GGUF loads");
    let info = engine.model_info();
    assert_eq!(info.chat_template.as_deref(), Some(INST_TEMPLATE));

    let mut config = common::test_config();
    config.chat_model_path = path.clone();
    let state = AppState::load(config).expect("models load");
    // Both copies are loaded (mapped); the 100 MB file need not outlive them.
    std::fs::remove_file(&path).expect("remove the rewritten GGUF");
    assert_eq!(state.template.source(), TemplateSource::Model);
    let rendered = state.template.render(&conversation()).expect("renders");
    let bos = &info.bos_token;
    let eos = &info.eos_token;
    assert_eq!(
        rendered,
        format!(
            "{bos}[INST] <<SYS>>\nBe brief.\n<</SYS>> [/INST][INST] What is Git? [/INST] A version control system.{eos}[INST] Who wrote it? [/INST]"
        )
    );

    // Through the server: the prompt it tokenized is that rendering.
    let base = common::start_app(state).await;
    let body = json!({
        "model": "smollm2-135m-instruct",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": " What is Git? "},
            {"role": "assistant", "content": "A version control system."},
            {"role": "user", "content": "Who wrote it?"}
        ],
        "temperature": 0,
        "max_tokens": 8,
    });
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::OK);
    let reply: Value = resp.json().await.expect("json");
    assert_eq!(
        reply["usage"]["prompt_tokens"].as_u64(),
        Some(engine.tokenize(&rendered).len() as u64),
        "{reply}"
    );
    assert!(reply["choices"][0]["message"]["content"].is_string());
}

#[test]
fn the_bundled_gguf_carries_its_own_chatml_template() {
    let engine = LlamaEngine::load(&common::test_config().chat_model_path, 1, 512).expect("loads");
    let template = engine.model_info().chat_template.expect("a template");
    assert!(template.contains("<|im_start|>"), "{template}");
}
