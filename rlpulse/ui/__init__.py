"""``rlpulse ui``: a run's page in the browser, from the archive and the live topics.

:mod:`rlpulse.ui.live` keeps the live topics' last minutes, :mod:`rlpulse.ui.data` answers the
page's questions in SQL over them and the archive, :mod:`rlpulse.ui.server` serves the page
(``static/``) and its JSON. The charts are Plotly's, from the ``plotly`` package's own copy of
plotly.js: nothing is fetched from the internet.
"""
