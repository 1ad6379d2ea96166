import pytest

from tilewise.runtime import device as dev


@pytest.mark.gpu
def test_device_info_is_sane():
    info = dev.device_info()
    assert info.sms > 0 and info.l2_mib > 0 and info.memory_gib > 1
    assert info.compute_capability.count(".") == 1
    assert info.slug and " " not in info.slug


@pytest.mark.gpu
def test_ceilings_are_measured_and_cached():
    c = dev.ceilings()
    assert 100 < c.copy_gbps < 20000
    assert set(c.peak_tflops) == set(dev.CEILING_DTYPES)
    assert c.peak_tflops["bf16"] > c.peak_tflops["fp32"] > 0
    assert c.ridge("bf16") > c.ridge("fp32")
    assert dev.ceilings() == c  # the second call reads the cache
