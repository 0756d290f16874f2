"""torch.compile's memory from the compiler's own decisions: the compiled loss read from inductor's
generated code (planner/profiler/inductor_buffers.py)."""

import torch.nn.functional as F

from planner.profiler import inductor_buffers

# torchtitan's compiled loss as inductor 2.13 wrote it for 64 tokens x 128 vocab (CPU), abridged to
# the wrapper's call(): forward then backward
_FORWARD = '''
    def call(self, args):
        primals_1, primals_2 = args
        args.clear()
        assert_size_stride(primals_1, (1, 64, 128), (8192, 128, 1), 'input')
        buf0 = empty_strided_cpu((64, 1), (1, 1), torch.float32)
        buf1 = empty_strided_cpu((64, 1), (1, 64), torch.float32)
        buf2 = reinterpret_tensor(buf1, (64, 1), (1, 1), 0); del buf1  # reuse
        buf3 = empty_strided_cpu((), (), torch.int64)
        buf5 = empty_strided_cpu((), (), torch.float32)
        buf4 = empty_strided_cpu((), (), torch.float32)
        buf6 = buf5; del buf5  # reuse
        cpp_fused__log_softmax__to_copy_nll_loss_forward_view_0(buf2, buf6, primals_1, primals_2, buf0, buf3, buf4)
        return (buf6, primals_1, primals_2, buf0, buf2, buf4, )
'''
_BACKWARD = '''
    def call(self, args):
        primals_1, primals_2, amax, log, convert_element_type_1, tangents_1 = args
        args.clear()
        buf0 = empty_strided_cpu((64, 1), (1, 64), torch.float32)
        buf1 = empty_strided_cpu((64, 128), (128, 1), torch.bfloat16)
        cpp_fused__log_softmax__log_softmax_backward_data_0(primals_2, tangents_1, convert_element_type_1, primals_1, amax, log, buf0, buf1)
        del amax
        del buf0
        del convert_element_type_1
        del log
        del primals_1
        del primals_2
        del tangents_1
        return (reinterpret_tensor(buf1, (1, 64, 128), (8192, 128, 1), 0), None, )
'''
LOGITS = 64 * 128 * 2
# kept: the bf16 logits (saved as primals_1), the fp32 max and log-sum-exp per token, one fp32 scalar
KEPT = LOGITS + 64 * 4 + 64 * 4 + 4
# the backward's peak: what is kept, the scalar gradient of the loss, a per-token fp32 scratch and
# the logits' bf16 gradient
PEAK = KEPT + 4 + 64 * 4 + LOGITS


def test_the_compiled_losss_wrappers_are_replayed_to_its_kept_and_peak_bytes():
    found = inductor_buffers.loss_bytes(_FORWARD, _BACKWARD, logits_bytes=LOGITS)
    assert (found.kept_bytes, found.peak_bytes) == (KEPT, PEAK)
    assert (round(found.kept_x, 4), round(found.peak_x, 4)) == (1.0315, 2.0474)


def test_torchtitans_loss_compiled_now_keeps_its_logits_and_peaks_at_their_gradient():
    def titan(pred, labels):  # torchtitan bbb1b616 train.py loss_fn
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    found, _ = inductor_buffers.compiled_loss(titan, tokens=64, vocab=128)
    assert (found.kept_bytes, found.peak_bytes) == (KEPT, PEAK)


def test_a_wrapper_statement_not_known_is_refused_not_skipped():
    import pytest

    odd = _FORWARD.replace("buf3 = empty_strided_cpu((), (), torch.int64)", "buf3 = torch.empty(8)")
    with pytest.raises(ValueError, match="does not know"):
        inductor_buffers.run_call(odd, {"primals_1": LOGITS, "primals_2": 0})
