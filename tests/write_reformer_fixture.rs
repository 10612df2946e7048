//! Writes tests/fixtures/legacy/reformer*.bpk with the ReformerLm code before the stack.
use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use memzoo_reformer::{AttentionKind, ReformerConfig};
use memzoo_tests::*;

pub fn reformer_fixture_config(reversible: bool) -> ReformerConfig {
    ReformerConfig::new()
        .with_vocab_size(32)
        .with_d_model(16)
        .with_n_layers(3)
        .with_n_heads(2)
        .with_d_head(8)
        .with_d_ff(32)
        .with_max_seq_len(16)
        .with_attn_layers(vec![AttentionKind::Local, AttentionKind::Lsh])
        .with_bucket_size(4)
        .with_n_rounds(2)
        .with_ff_chunk_len(3)
        .with_dropout(0.0)
        .with_init_std(0.3)
        .with_eval_seed(7)
        .with_reversible(reversible)
        .with_axial_positions(reversible)
}

#[test]
#[ignore]
fn write_reformer_fixture() {
    let dev = memzoo_backend::parse_device("flex").unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/legacy");
    let v: Vec<i64> = (0..20).map(|i| ((i * 7 + 3 + i * i) % 32) as i64).collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(v, [2, 10]), &dev);
    let mut out = serde_json::Map::new();
    for (name, rev) in [("reformer", true), ("reformer_plain", false)] {
        let model = reformer_fixture_config(rev).init(&dev).unwrap();
        model.clone().save_file(dir.join(format!("{name}.bpk"))).unwrap();
        let logits = host(model.forward(tokens.clone()).unwrap());
        out.insert(name.into(), serde_json::json!(logits));
    }
    std::fs::write(dir.join("reformer.json"), serde_json::to_string(&out).unwrap()).unwrap();
}
