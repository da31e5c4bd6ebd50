//! The bundled local model server: a real chat model (llama.cpp through
//! `llama-cpp-2`) and a real embedding model (MiniLM BERT, run by llama.cpp,
//! or by candle as fallback) on the CPU, spoken to over the OpenAI and Vertex
//! wire shapes the gateway already uses.

pub mod admission;
pub mod api;
pub mod bert_gguf;
pub mod chat;
pub mod chat_template;
pub mod config;
pub mod cpu_variant;
pub mod embeddings;
pub mod engine;
pub mod error;
pub mod fetch;
pub mod generation;
pub mod grammar;
pub mod llama_bert;
pub mod packed_bert;
pub mod server;
pub mod speculation;
pub mod stop;
#[doc(hidden)]
pub mod testing;
pub mod tools;
