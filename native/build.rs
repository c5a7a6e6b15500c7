// The messages come from the one .proto the Python client is generated from
// (protos/schola/schola_gym.proto), compiled by protox: no protoc binary needed.
fn main() {
    let proto_dir = "../protos/schola";
    let file = format!("{proto_dir}/schola_gym.proto");
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([file.as_str()], [proto_dir]).expect("compile schola_gym.proto");
    prost_build::Config::new()
        .compile_fds(descriptors)
        .expect("generate Rust messages from schola_gym.proto");
}
