use anyhow::Result;
use labs_core::Device;

pub fn run(_device: &Device, _json: bool) -> Result<()> {
    Ok(())
}
