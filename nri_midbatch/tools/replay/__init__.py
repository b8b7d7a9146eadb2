"""`nri-midbatch replay`: a recording run through a fresh plugin, and what it answers now.

`runner` drives the plugin with the recorded calls (in process or through a socket pair),
`compare` puts each decision next to the recorded one, `report` prints the table or JSON,
`golden` writes and checks golden files, and `command` is the subcommand that ties them.
"""
