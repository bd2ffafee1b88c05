"""Presentation of the library's plain data: the lookup statistics report
(`statistics`: a text summary and one self-contained HTML page).

It reads the engine's statistics (`estimator_spec.engine.statistics`) and
writes through `estimator_spec.files`; nothing below it imports it
(docs/architecture.md, 'Who owns what').
"""
