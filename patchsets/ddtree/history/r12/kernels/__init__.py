"""DDTree's Triton kernels by pipeline stage, as the patchset keeps them (not installed: ``new_files``
puts each module into ``sglang/kernels/ops/speculative/``, beside SGLang's own speculative kernels).

``ddtree_prep`` (the drafter logits' top-K) -> ``ddtree_beam`` (the tree's nodes and order) ->
``ddtree_verify_inputs`` (labels, retrieve arrays, tree mask, SGLang's custom_mask) -> (the
target's verify; on SGLang's triton backend its attention is ``ddtree_verify_attention``) ->
``ddtree_walk`` (the accepted path); ``ddtree_keys`` holds the packed keys and
counts they share. They depend on torch and Triton alone (and each other, relatively), never on the
DDTree modules that call them (``sglang/srt/speculative/ddtree_*.py``).
"""
