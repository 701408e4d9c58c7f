"""Equivalence, Grid and History: the tabs, their events, what the comparison view shows (`layouts`) and the view
itself (`view` + `.js`, `.css`)."""
