//! Finds libfabric with pkg-config, refuses versions below 1.14 with a clear
//! message, compiles the shim for the static inline calls and runs bindgen
//! against the host's headers.

use std::path::PathBuf;
use std::process::Command;

/// The oldest libfabric API fmx is written against (FI_MR_* modes as bits,
/// fi_tinject, FI_HMEM-era headers).
const MIN: (u32, u32) = (1, 14);

fn pkg_config(args: &[&str]) -> Result<String, String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("libfabric")
        .output()
        .map_err(|e| format!("cannot run pkg-config ({e}): install pkg-config and libfabric-dev (scripts/ensure-packages ofi)"))?;
    if !out.status.success() {
        return Err(format!(
            "pkg-config cannot find libfabric ({}): install libfabric-dev (scripts/ensure-packages ofi) or set PKG_CONFIG_PATH",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split('.').map(|p| p.trim().parse::<u32>());
    Some((it.next()?.ok()?, it.next()?.ok()?))
}

fn fail(msg: &str) -> ! {
    eprintln!("error: fmx-ofi-sys: {msg}");
    println!("cargo::error=fmx-ofi-sys: {msg}");
    std::process::exit(1);
}

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let version = pkg_config(&["--modversion"]).unwrap_or_else(|e| fail(&e));
    let Some((major, minor)) = parse_version(&version) else { fail(&format!("cannot read libfabric's version {version:?}")) };
    if (major, minor) < MIN {
        fail(&format!(
            "libfabric {version} is too old: fmx's ofi transport needs {}.{} or newer (FI_MR_* mode bits, fi_tinject)",
            MIN.0, MIN.1
        ));
    }
    println!("cargo:rustc-env=FMX_LIBFABRIC_VERSION={version}");
    println!("cargo:version={version}");

    let cflags = pkg_config(&["--cflags"]).unwrap_or_else(|e| fail(&e));
    let libs = pkg_config(&["--libs"]).unwrap_or_else(|e| fail(&e));
    let includes: Vec<&str> = cflags.split_whitespace().filter_map(|f| f.strip_prefix("-I")).collect();
    for f in libs.split_whitespace() {
        if let Some(dir) = f.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = f.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={lib}");
        }
    }

    let mut shim = cc::Build::new();
    shim.file("shim/shim.c").warnings(true).flag_if_supported("-Wno-unused-parameter");
    for i in &includes {
        shim.include(i);
    }
    shim.compile("fmx_ofi_shim");

    let mut b = bindgen::Builder::default()
        .header("shim/shim.h")
        .allowlist_function("fi_getinfo|fi_freeinfo|fi_dupinfo|fi_strerror|fi_version|fmx_fi_.*")
        .allowlist_type("fi_.*|fid_.*")
        .allowlist_var("FI_.*")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false);
    for i in &includes {
        b = b.clang_arg(format!("-I{i}"));
    }
    let bindings = b.generate().unwrap_or_else(|e| fail(&format!("bindgen failed on libfabric {version}'s headers: {e}")));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    bindings.write_to_file(out.join("bindings.rs")).unwrap_or_else(|e| fail(&format!("write bindings: {e}")));
}
