//! Checkpoint import from compressive-transformer-pytorch 0.4.0: its `CompressiveTransformer`
//! read into memzoo's compressive stack, compared with the package's own run.
//!
//! The fixture (`tests/fixtures/lucidrains-compressive`) is a small random-weight model run by
//! the package itself (`xtask/peers/fixtures/lucidrains_compressive.py`) over 6 segments in
//! training mode: log-probabilities, LM losses, the weighted attention-reconstruction losses,
//! both memories after every segment (the XL memory filling in two segments, the compressed
//! one from the third, full from the fourth and dropping its oldest after), and the gradient
//! of every parameter for the sum of all 12 losses. Float comparisons: `max |memzoo - package|
//! <= 1e-4 · max(1, max |package|)` (`import::check`).

use std::path::{Path, PathBuf};

use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::activation::log_softmax;
use memzoo_import::lucidrains_compressive::{self, compressive_to_peer};
use memzoo_import::mapping::Source;
use memzoo_stack::XlState;
use memzoo_tests::*;

use crate::import::{Reference, check, check_gradients};

const SEGMENTS: usize = 6;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lucidrains-compressive")
}

#[test]
fn lucidrains_compressive_matches_the_package() {
    let dev = flex().autodiff();
    let (model, cfg) = lucidrains_compressive::load(&fixture(), &dev).expect("import");
    assert_eq!(model.stack_family(), "compressive");
    assert_eq!(
        (
            cfg.depth,
            cfg.seq_len,
            cfg.mem_len,
            cfg.cmem_len,
            cfg.cmem_ratio
        ),
        (2, 4, 8, 4, 2)
    );
    let r = Reference::at(&fixture());
    let batch = r.data("input_ids.0").shape()[0];
    let mut state = XlState::new();
    let mut total: Option<Tensor<1>> = None;
    let mut compressed = 0;
    for s in 0..SEGMENTS {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &dev);
        let y = r.tokens::<2>(&format!("targets.{s}"), &dev);
        let (hidden, aux) = model
            .forward_compressive_train(x, &mut state, &vec![false; batch])
            .unwrap();
        let loss = r.check_scores(s, log_softmax(model.logits(hidden), 2), y);
        let want_aux = r.floats(&format!("aux_loss.{s}"));
        let got_aux = aux.clone().map_or(vec![0.0], host);
        check(&got_aux, &want_aux, &format!("reconstruction loss {s}"));
        if want_aux[0] > 0.0 {
            compressed += 1;
        }
        let loss = match aux {
            Some(a) => loss + a,
            None => loss,
        };
        total = Some(match total {
            Some(t) => t + loss,
            None => loss,
        });
        // Both memories: the package's normalised inputs and their compressions.
        for l in 0..cfg.depth {
            let want = r.float::<4>(&format!("mem.{s}"), &dev);
            let [_, _, m, d] = want.dims();
            assert_eq!(state.xl.len(), m, "XL memory length after {s}");
            let want = want.narrow(0, l, 1).reshape([batch, m, d]);
            let got = model.layers[l].read_memory(state.xl.layer(l).unwrap().clone(), false);
            check(&host(got), &host(want), &format!("memory {s}.{l}"));
            let want = r.float::<4>(&format!("cmem.{s}"), &dev);
            let [_, _, c, d] = want.dims();
            assert_eq!(
                state.compressed.layers.len(),
                c,
                "compressed length after {s}"
            );
            if c > 0 {
                let want = want.narrow(0, l, 1).reshape([batch, c, d]);
                let got = state.compressed.layers.layer(l).unwrap().clone();
                check(
                    &host(got),
                    &host(want),
                    &format!("compressed memory {s}.{l}"),
                );
            }
        }
    }
    assert_eq!(compressed, 4, "segments with a reconstruction loss");
    let grads = GradientsParams::from_grads(total.unwrap().backward(), &model);
    let got = compressive_to_peer(&model, Source::Gradients(&grads)).unwrap();
    assert_eq!(got.len(), r.names("grad.").len(), "gradients");
    // The package's `to_kv.weight` loses its gradient to an in-place detach (see the fixture
    // script): memzoo's is its LM gradient, recorded with that detach disabled.
    let kv = |n: &str| n.ends_with("to_kv.weight");
    check_gradients(&got, &r, "grad.", kv);
    let lm: memzoo_import::mapping::PeerTensors = got.into_iter().filter(|(n, _)| kv(n)).collect();
    assert_eq!(lm.len(), cfg.depth);
    check_gradients(&lm, &r, "lm_grad.", |n| !kv(n));
}

/// An option memzoo's stack cannot express is refused by name.
#[test]
fn lucidrains_compressive_refuses_what_it_cannot_express() {
    let mut cfg: memzoo_import::CompressivePeerConfig =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
            .unwrap();
    assert!(cfg.xl_config().is_ok());
    cfg.enhanced_recurrence = true;
    let err = cfg.xl_config().unwrap_err().to_string();
    assert!(err.contains("enhanced_recurrence"), "{err}");
}

/// Export writes what the import reads: the package's config and every tensor, unchanged; a
/// stack the package cannot express is refused naming the field.
#[test]
fn lucidrains_compressive_export_round_trips() {
    let dev = flex();
    let (model, cfg) = lucidrains_compressive::load(&fixture(), &dev).unwrap();
    let stack = cfg.xl_config().unwrap();
    let format = memzoo_import::format("lucidrains-compressive").unwrap();
    let dir = crate::import::scratch("compressive-export");
    format.export(&model, &stack, &dir).unwrap();
    let (_, back) = lucidrains_compressive::load(&dir, &dev).unwrap();
    assert_eq!(back, cfg);
    let want = memzoo_import::TensorMap::read(&fixture().join("model.safetensors")).unwrap();
    let got = memzoo_import::TensorMap::read(&dir.join("model.safetensors")).unwrap();
    assert_eq!(got.names().count(), want.names().count());
    for name in want.names() {
        let w = want.get(name).unwrap().clone().convert::<f32>();
        let g = got.get(name).unwrap().clone().convert::<f32>();
        assert_eq!(g.shape(), w.shape(), "{name}");
        check(
            &g.try_to_vec::<f32>().unwrap(),
            &w.try_to_vec::<f32>().unwrap(),
            name,
        );
    }
    let err = format
        .export(
            &model,
            &stack
                .clone()
                .with_compat(stack.compat.clone().with_final_norm(true)),
            &dir,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("final_norm"), "{err}");
}
