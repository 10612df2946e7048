//! Tests of the examples: the small XL learns the copied text through its memory, trained by
//! memzoo's trainer, and the examples' flags are checked by clap.

use burn::module::Module;
use burn::tensor::Device;
use clap::Parser;

use super::*;

fn flex() -> Device {
    memzoo::backend::parse_device("flex").unwrap()
}

#[test]
fn the_small_xl_learns_the_copy_through_its_memory_and_not_without() {
    // A shortened xl_train: with memory the repeated letters fall far below guessing
    // (log2 26 = 4.70 bits); without memory they cannot.
    let task = CopyTask::default();
    let run = |mem_len: usize| {
        let device = flex().autodiff();
        device.seed(0);
        let model = small_xl(mem_len).init(&device).unwrap();
        let how = CopyTraining {
            steps: 1000,
            lr: 3e-3,
            warmup: 20,
            log_every: 0,
        };
        let dir = RunDir::scratch("test");
        let model = train_copy(model, &task, how, dir.path()).unwrap();
        eval_copy(&model.valid(), &task, 64, 5).unwrap()
    };
    let (with, _) = run(8);
    let (without, _) = run(0);
    eprintln!("repeated letters: {with:.3} bits with memory, {without:.3} without");
    assert!(with < 1.0, "with memory: {with}");
    assert!(without > 4.0, "without memory: {without}");
}

/// The flags of `xl_train`, as clap reads them.
#[derive(clap::Parser, Debug)]
struct XlTrainFlags {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    task: CopyArgs,
}

#[test]
fn flags_parse_and_unknown_flags_are_errors() {
    let ok =
        XlTrainFlags::try_parse_from(["xl_train", "--seg-len", "8", "--device", "flex"]).unwrap();
    assert_eq!(ok.task.task().seg_len, 8);
    assert_eq!(ok.task.task().passage, CopyTask::default().passage);
    assert_eq!(ok.common.device().unwrap(), flex());
    // A typo'd flag is an error naming it, not silently ignored.
    let err = XlTrainFlags::try_parse_from(["xl_train", "--seglen", "8"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("--seglen"), "{err}");
    let err = XlTrainFlags::try_parse_from(["xl_train", "--batch", "many"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("many"), "{err}");
}
