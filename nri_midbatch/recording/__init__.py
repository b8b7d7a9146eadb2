"""Recordings of the NRI calls the plugin serves: the call and its decisions (`call`), the line
format (`format`), what a line leaves out (`redact`), the writer (`writer`: the recorder with
its bounded queue and rotating file) and the reader (`reader`), which replay and explain use.
"""
