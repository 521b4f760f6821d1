"""Each notebook's closing claims table, built in one call.

One module per lesson (``two_phases``, ``roofline``, ...): a function that takes what the notebook
measured and returns the ``claims_table`` of its claims, each row a verdict from
``minieng.course.verdicts``. The notebook's last cell is that one call, so the learner reads the
measurement in the cells above and the bookkeeping of the table lives here.
"""
