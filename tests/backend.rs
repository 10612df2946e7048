//! Device selection from strings.

use memzoo_backend::{DeviceSpec, parse_device};

#[test]
fn device_strings_pick_backends_or_name_the_missing_feature() {
    assert!(parse_device("flex").is_ok());
    for name in ["wgpu", "cuda", "tch", "tch-cuda"] {
        let spec: DeviceSpec = name.parse().unwrap();
        if !spec.is_compiled() {
            let err = parse_device(name).unwrap_err().to_string();
            assert!(
                err.contains(&format!("--features {}", spec.feature())),
                "{err}"
            );
        }
    }
    let err = parse_device("gpu").unwrap_err().to_string();
    assert!(err.contains("unknown device `gpu`"), "{err}");
}
