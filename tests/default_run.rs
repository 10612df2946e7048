//! The default run's point (`memzoo train` with no arguments): on the generated corpus of
//! `LongRangeConfig::near`, the XL memory lets the model predict letters that only the memory
//! can predict. A shorter run of the default configuration must get clearly below what
//! guessing those letters costs (computed here from the corpus), and the same weights reading
//! no memory must not.

use memzoo::config::RunConfig;
use memzoo::data_setup::{doc_batcher, load_corpus};
use memzoo_data::{Split, recallable_mask};
use memzoo_tests::*;
use memzoo_train::{RecurrentModel, RunOptions, evaluate, train};

/// Steps of the test run (the default takes 5,000; the seeds tried learn the copy by ~2,500
/// with the schedule of 5,000 and by 3,000 with one of 3,000).
const STEPS: usize = 3000;

#[test]
fn the_default_run_predicts_from_memory_what_only_memory_can_predict() {
    // As `memzoo train` reads it: the generated corpus is documents, so every row starts a
    // document at a segment boundary and the memory is cleared there (`on_data`).
    let mut config = RunConfig::default().on_data().unwrap();
    assert!(config.model.document_resets);
    config.train.steps = STEPS;
    config.train.eval_every = 0;
    config.train.checkpoint_every = 0;
    config.data.generated.valid_documents = 100;
    config.validate().unwrap();
    let (t, m) = (&config.train, &config.model);

    // The premise, checked on the validation text: every recallable byte repeats the byte
    // `distance` positions back, further back than a segment reaches and within the memory
    // (the query one position before it attends `distance - 1` back).
    let (_, corpus) = load_corpus(&config.data).unwrap();
    let text = &corpus.valid;
    let mask = recallable_mask(text);
    let distance = config.data.generated.recall_distance().unwrap();
    assert!(
        distance > t.tgt_len,
        "source {distance} back, segment {}",
        t.tgt_len
    );
    assert!(
        distance - 1 <= m.mem_len,
        "source {distance} back, memory {}",
        m.mem_len
    );
    let recalled: Vec<usize> = (0..text.len()).filter(|&p| mask[p]).collect();
    assert!(
        recalled.len() > text.len() / 4,
        "{} of {}",
        recalled.len(),
        text.len()
    );
    for &p in &recalled {
        assert_eq!(text[p], text[p - distance], "byte {p}");
    }
    // What a guess costs: the recalled bytes are drawn uniformly from this many values.
    let mut seen = [false; 256];
    recalled.iter().for_each(|&p| seen[text[p] as usize] = true);
    let values = seen.iter().filter(|&&s| s).count();
    let guess = (values as f64).log2();
    assert!(guess > 4.0, "{values} values");

    // The run, as `memzoo train` does it.
    let device = flex().autodiff();
    device.seed(t.seed);
    let batches = |split| {
        doc_batcher(&config.data, split, t.batch, t.tgt_len)
            .unwrap()
            .expect("the generated corpus is documents")
    };
    let mut train_data = batches(Split::Train);
    let mut valid_data = batches(Split::Valid);
    let dir = std::env::temp_dir().join(format!("memzoo-default-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = RunOptions {
        run_dir: dir.clone(),
        resume: false,
        quiet: true,
    };
    let model = m.init(&device).unwrap();
    let out = train(model, t, &mut train_data, Some(&mut valid_data), &options).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let bits = |nats: Option<f64>| nats.unwrap() / std::f64::consts::LN_2;
    let with = bits(out.valid.unwrap().selected_loss);
    let no_memory = out.model.clone().with_eval_mem_len(0);
    let r = evaluate(&no_memory, &mut valid_data, t.tgt_len, t.eval_segments).unwrap();
    let without = bits(r.selected_loss);
    println!(
        "recallable bytes: {with:.3} bits with memory, {without:.3} without, guess {guess:.3}"
    );
    assert!(
        with < guess / 2.0,
        "with memory {with:.3} bits, not clearly below a guess ({guess:.3})"
    );
    // Nothing in the segment tells those letters: without memory no model beats a guess.
    assert!(
        without > guess - 0.2,
        "without memory {without:.3} bits, below a guess ({guess:.3})"
    );
}
